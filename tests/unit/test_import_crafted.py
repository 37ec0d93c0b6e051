"""``recovery import`` against files crafted to slip between the scan and ``torch.load``
(issue 26): a member torch's lookup finds and the scan did not read, tensors that view
more than their storage holds, a deflate bomb, symlinks out of a Hugging Face directory.
Every file is real bytes; torch's own reader shows what ``torch.load`` would read."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import safetensors.torch
import torch

from recovery.errors import FormatError, UnsafePathError
from recovery.format import pickles, rebuilds, zipread
from recovery.tools import importing
from tests.unit.torchfiles import (
    Payload,
    Storage,
    View,
    archive,
    bomb,
    dumps,
    members,
    saved,
    two_directories,
    zipped,
)


@pytest.fixture
def no_unpickling(monkeypatch):
    """Fail the test if torch.load is ever reached."""
    calls = []
    monkeypatch.setattr(pickles.torch, "load", lambda *a, **k: calls.append(a) or 1 / 0)
    return calls


@pytest.fixture
def decoy(tmp_path):
    """A file outside everything imported, that nothing may read or write."""
    path = tmp_path / "decoy-secret"
    path.write_text("aws_secret_access_key = DECOYDECOYDECOY\n")
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refused(path: Path, out: Path, signer, match: str, error=FormatError) -> None:
    with pytest.raises(error, match=match):
        importing.import_weights(path, out, signer=signer)
    assert not out.exists()


# -- the member torch.load reads is the one the scan read -------------------------------


def renamed(src: bytes, old: str, new: str, blob: bytes | None = None) -> list[tuple[str, bytes]]:
    return [(new, blob if blob is not None else b) if n == old else (n, b) for n, b in members(src)]


def test_a_pickle_torch_finds_by_case_is_refused_by_the_scan(
    tmp_path, signer, no_unpickling, decoy
):
    # torch's reader looks records up ignoring case: data.pkl finds archive/DATA.PKL, which
    # the old scan skipped (not *.pkl) after scanning the harmless archive/x/data.pkl
    payload = pickle.dumps(Payload(decoy), protocol=2)
    entries = renamed(saved({"w": torch.ones(2)}), "archive/data.pkl", "archive/DATA.PKL", payload)
    data = zipped([*entries, ("archive/x/data.pkl", dumps({}))])
    assert torch._C.PyTorchFileReader(io.BytesIO(data)).get_record("data.pkl") == payload
    (tmp_path / "evil.pt").write_bytes(data)
    before = sha(decoy)
    found = r"'archive/DATA\.PKL', which torch's reader reads as data\.pkl \(it ignores case\)"
    refused(tmp_path / "evil.pt", tmp_path / "o", signer, rf"evil\.pt: .*{found}; nothing was")
    assert no_unpickling == [] and sha(decoy) == before


def _twin_storage() -> bytes:
    obj = {"w": View(Storage("a", 2), 0, (2,), (1,))}
    entries = [("archive/data.pkl", dumps(obj)), ("archive/data/a", bytes(8))]
    return zipped([*entries, ("archive/data/A", bytes(8)), ("archive/version", b"3\n")])


SAVED = saved({"w": torch.ones(2)})
PAYLOAD = pickle.dumps(Payload(Path("/nonexistent/decoy")), protocol=2)


@pytest.mark.parametrize(
    ("data", "found"),
    [
        pytest.param(
            zipped(renamed(SAVED, "archive/data.pkl", "archive/Data.pkl")),
            "reads as data.pkl",
            id="case",
        ),
        pytest.param(
            zipped([*members(SAVED), ("archive/Data.pkl", b"")]), "reads as data.pkl", id="twin"
        ),
        pytest.param(_twin_storage(), "one member per name, case ignored.*data/A", id="twin-data"),
        pytest.param(
            zipped([*members(SAVED), ("other/data.pkl", b"")]),
            "every member under archive/",
            id="outside-prefix",
        ),
        pytest.param(
            zipped([("evil/data.pkl", b""), *members(SAVED)]),
            "every member under evil/",
            id="first-member-elsewhere",
        ),
        pytest.param(
            zipped([("data.pkl", b""), *members(SAVED)]), "one directory", id="no-directory"
        ),
        pytest.param(
            zipped([*members(SAVED), ("archive/constants.pkl", b"")]),
            "constants.pkl",
            id="torchscript",
        ),
        pytest.param(
            zipped([*members(SAVED), ("archive/data/9", b"")]),
            r"unnamed \['9'\]",
            id="unnamed-storage",
        ),
        pytest.param(
            two_directories(PAYLOAD),
            r"one central directory ending at byte \d+, where",
            id="two-directories",
        ),
        pytest.param(SAVED + bytes(8), "ending in its end record", id="appended"),
    ],
)
def test_an_archive_two_readers_could_read_differently_is_refused(data, found, no_unpickling):
    with pytest.raises(FormatError, match=found):
        pickles.scan(data, name="w.pt")
    assert no_unpickling == []


def test_two_central_directories_show_the_two_readers_different_pickles():
    data = two_directories(PAYLOAD)
    assert zipfile.ZipFile(io.BytesIO(data)).read("archive/data.pkl") == members(SAVED)[0][1]
    assert torch._C.PyTorchFileReader(io.BytesIO(data)).get_record("data.pkl").startswith(PAYLOAD)
    with pytest.raises(FormatError, match="two directories: two readers could list"):
        pickles.scan(data, name="w.pt")


def test_torch_reader_finding_a_record_elsewhere_is_refused():
    with pytest.raises(FormatError, match=r"find data\.pkl at byte 0 \(1 bytes\).*found byte"):
        zipread._torch_agrees(SAVED, {"data.pkl": (0, 1)}, name="w.pt")


def test_a_rezipped_torch_save_archive_passes_and_loads():
    # Python's zipfile writes no zip64 end record (torch.save does): both layouts read
    data = zipped(members(SAVED))
    assert pickles.scan(data, name="w.pt") == "zip"
    assert torch.equal(pickles.load(data, name="w.pt")["w"], torch.ones(2))


# -- tensors hold no more than their storages, storages no more than the file ----------


class Alloc:
    def __reduce__(self):
        return (torch.FloatStorage, (1 << 40,))


w = torch.arange(6.0).reshape(2, 3)


EXPANDED = torch.ones(1).expand(1 << 33)  # 2^33 float32 viewing 4 bytes


def _build_on_storage() -> bytes:
    # BUILD {'key': '9'} on the storage a persistent id returned, before the tensor uses it
    pickled = dumps({"x": View(Storage("0", 2), 0, (2,), (1,))})
    at = pickled.index(b"Q") + 1  # after BINPERSID
    build = b"}X\x03\x00\x00\x00keyX\x01\x00\x00\x009sb"
    entries = [("archive/data.pkl", pickled[:at] + build + pickled[at:])]
    return zipped([*entries, ("archive/data/0", bytes(8)), ("archive/version", b"3\n")])


@pytest.mark.parametrize(
    ("data", "found"),
    [
        pytest.param(
            saved({"x": EXPANDED}),
            r"\['x'\] \(offset 0, size \(8589934592,\), stride \(0,\)\) to hold each element",
            id="expanded",
        ),
        pytest.param(
            saved({"x": EXPANDED}, legacy=True),
            r"stride \(0,\)\) to hold each element in its own bytes, found an expanded",
            id="expanded-legacy",
        ),
        pytest.param(
            archive({"x": View(Storage("0", 9), 0, (3, 3), (1, 1))}, {"0": bytes(36)}),
            "found an expanded or overlapping view",
            id="overlapping-strides",
        ),
        pytest.param(
            archive({"x": View(Storage("0", 1 << 33), 0, (1 << 33,), (1,))}, {"0": bytes(4)}),
            r"to hold 34359738368 bytes of the file, found 4 bytes",
            id="storage-past-file",
        ),
        pytest.param(
            archive({"x": View(Storage("0", 4), 3, (2,), (1,))}, {"0": bytes(16)}),
            "it reaches byte 20 of 16",
            id="view-past-storage",
        ),
        pytest.param(
            saved({"a": w, "t": w.t()}),
            r"\['t'\] to share no bytes with tensor \['a'\]",
            id="transposed-alias",
        ),
        pytest.param(
            saved({"a": w, "row": w[1]}, legacy=True),
            r"\['row'\] to share no bytes",
            id="partial-alias-legacy",
        ),
        pytest.param(archive({"x": Alloc()}, {}), r"a call to torch\.FloatStorage", id="call"),
        pytest.param(_build_on_storage(), r"a BUILD on storage \(\{'key': '9'\}\)", id="build"),
        pytest.param(
            saved({"w": w}, legacy=True) + b"\0", "end after its storages", id="legacy-trailing"
        ),
        pytest.param(
            saved({"w": w}, legacy=True)[:-4],
            "a count of 6 and 20 bytes left",
            id="legacy-truncated",
        ),
    ],
)
def test_tensors_past_or_across_their_storage_are_refused_before_loading(
    tmp_path, signer, no_unpickling, data, found
):
    (tmp_path / "w.pt").write_bytes(data)
    refused(tmp_path / "w.pt", tmp_path / "o", signer, found)
    assert no_unpickling == []


def test_every_global_the_scan_allows_has_an_inert_stand_in():
    reader = rebuilds._Reader(io.BytesIO(), rebuilds.Refs(), ids=5)
    assert set(reader.table) == pickles.ALLOWED


def test_tied_weights_and_disjoint_slices_of_one_storage_import(tmp_path, signer):
    emb, qkv = torch.randn(4, 2), torch.randn(6, 2)
    sd = {"emb": emb, "head": emb, "q": qkv[:2], "k": qkv[2:4], "v": qkv[4:]}
    for legacy in (False, True):
        (tmp_path / "w.pt").write_bytes(saved(sd, legacy=legacy))
        out = tmp_path / f"o{legacy}"
        result = importing.import_weights(tmp_path / "w.pt", out, signer=signer)
        assert result.record["tensors"] == 5
        stored = safetensors.torch.load_file(out / "model.safetensors")
        assert any(torch.equal(t, emb) for t in stored.values())


# -- compressed members are never opened -------------------------------------------------


def test_a_deflate_bomb_is_refused_unopened(tmp_path, signer, no_unpickling):
    bomb(tmp_path / "bomb.pt", numel=1 << 26)  # 256 MiB of zeros in ~256 KiB
    assert (tmp_path / "bomb.pt").stat().st_size < 1 << 20
    found = r"compression method 8 \(\d+ bytes that would become 268435456\); it was not opened"
    refused(tmp_path / "bomb.pt", tmp_path / "o", signer, rf"data/0 stored uncompressed.*{found}")
    deflated = zipped(members(SAVED), deflate=("archive/data.pkl",))
    with pytest.raises(FormatError, match="archive/data.pkl stored uncompressed"):
        pickles.scan(deflated, name="w.pt")
    assert no_unpickling == []


# -- a Hugging Face directory: symlinks only into the cache's own blobs ------------------


def hf_cache(root: Path, weights, *, absolute: bool = False) -> Path:
    """``root/models--org--tiny`` as huggingface_hub lays it out: blobs named by their
    sha256, a snapshot of links to them. Returns the snapshot directory."""
    repo = root / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snap = repo / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    files = {
        "config.json": json.dumps({"model_type": "tiny"}).encode(),
        "model.safetensors": safetensors.torch.save(weights),
    }
    for name, blob in files.items():
        digest = hashlib.sha256(blob).hexdigest()
        (repo / "blobs" / digest).write_bytes(blob)
        target = repo / "blobs" / digest if absolute else Path("../../blobs") / digest
        (snap / name).symlink_to(target)
    return snap


WEIGHTS = {"w": torch.randn(3, 2), "b": torch.zeros(3)}


@pytest.mark.parametrize("absolute", [False, True])
def test_a_hugging_face_cache_snapshot_imports_through_its_blob_links(tmp_path, signer, absolute):
    snap = hf_cache(tmp_path / "hub", WEIGHTS, absolute=absolute)
    result = importing.import_weights(snap, tmp_path / "o", signer=signer)
    rec = result.record
    assert rec["kind"] == "hf" and rec["model_config_from"] == "config.json"
    assert [(f["name"], f["sha256"]) for f in rec["files"]] == [
        (n, sha(snap / n)) for n in ("model.safetensors", "config.json")
    ]


def _relink(path: Path, target: Path | str) -> None:
    path.unlink()
    path.symlink_to(target)


def link_config_out(snap, decoy):
    _relink(snap / "config.json", decoy)


def link_config_up(snap, decoy):
    _relink(snap / "config.json", os.path.relpath(decoy, snap))


def link_weights_to_another_repo(snap, decoy):
    other = snap.parents[2] / "models--someone--else" / "blobs"
    other.mkdir(parents=True)
    (other / "f00d").write_bytes(safetensors.torch.save({"secret": torch.ones(1)}))
    _relink(snap / "model.safetensors", other / "f00d")


def link_blobs_dir_out(snap, decoy):
    repo = snap.parents[1]
    elsewhere = decoy.parent / "elsewhere"
    (repo / "blobs").rename(elsewhere)
    (repo / "blobs").symlink_to(elsewhere)
    (elsewhere / "cfg").write_bytes(decoy.read_bytes())
    _relink(snap / "config.json", "../../blobs/cfg")


def link_a_blob_out(snap, decoy):
    blob = snap.parents[1] / "blobs" / "cfg"
    blob.symlink_to(decoy)
    _relink(snap / "config.json", "../../blobs/cfg")


def link_in_a_plain_directory(snap, decoy):
    plain = snap.parents[3] / "plain"
    plain.mkdir()
    safetensors.torch.save_file(WEIGHTS, plain / "model.safetensors")
    (plain / "config.json").symlink_to(decoy)
    return plain


@pytest.mark.parametrize(
    "attack",
    [
        link_config_out,
        link_config_up,
        link_weights_to_another_repo,
        link_blobs_dir_out,
        link_a_blob_out,
        link_in_a_plain_directory,
    ],
)
def test_a_symlink_out_of_the_cache_layout_is_refused_unread(tmp_path, signer, decoy, attack):
    snap = hf_cache(tmp_path / "hub", WEIGHTS)
    before = sha(decoy)
    directory = attack(snap, decoy) or snap
    refused(
        directory, tmp_path / "o", signer, r"found a symlink to .*nothing was read", UnsafePathError
    )
    assert sha(decoy) == before


def test_a_sharded_index_or_shard_linked_out_is_refused(tmp_path, signer, decoy):
    d = tmp_path / "hf"
    d.mkdir()
    safetensors.torch.save_file(WEIGHTS, tmp_path / "outside.safetensors")
    index = {"weight_map": dict.fromkeys(WEIGHTS, "model-1.safetensors")}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    (d / "model-1.safetensors").symlink_to(tmp_path / "outside.safetensors")
    refused(d, tmp_path / "o", signer, r"model-1\.safetensors: .*found a symlink", UnsafePathError)
    (d / "model-1.safetensors").unlink()
    safetensors.torch.save_file(WEIGHTS, d / "model-1.safetensors")
    (d / "model.safetensors.index.json").rename(tmp_path / "index.json")
    (d / "model.safetensors.index.json").symlink_to(tmp_path / "index.json")
    refused(d, tmp_path / "o", signer, r"index\.json: .*found a symlink", UnsafePathError)
    (d / "model.safetensors.index.json").unlink()
    (tmp_path / "index.json").rename(d / "model.safetensors.index.json")
    assert importing.import_weights(d, tmp_path / "o", signer=signer).record["tensors"] == 2


def test_the_file_the_user_names_may_itself_be_a_link(tmp_path, signer):
    (tmp_path / "real.pt").write_bytes(saved(WEIGHTS))
    (tmp_path / "w.pt").symlink_to(tmp_path / "real.pt")
    assert importing.import_weights(tmp_path / "w.pt", tmp_path / "o", signer=signer)


@pytest.mark.parametrize(
    ("bound", "body", "found"),
    [
        ("MAX_MEMO", b")\x94" * 10_001, "more than 10000 memoized values"),
        ("MAX_OPS", b")0" * 50_001, "more than 50000 opcodes"),
    ],
)
def test_a_pickle_past_its_bounds_is_refused_while_scanning(bound, body, found, monkeypatch):
    """The scan counts as it goes and stops at the bound, its memory flat (the bounds at a
    hundredth of their size here: the same code, a hundredth of the time)."""
    import resource

    from recovery.errors import FormatError
    from recovery.format import pickles

    assert (pickles.MAX_MEMO, pickles.MAX_OPS) == (1_000_000, 5_000_000)  # as documented
    monkeypatch.setattr(pickles, bound, getattr(pickles, bound) // 100)
    data = b"\x80\x04" + body + b"."
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(FormatError, match=found):
        pickles.scan(data, name="bomb.pt")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 100_000  # KiB
