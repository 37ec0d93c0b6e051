"""Sharded tensor files, parallel hashing, BLAKE3, and checkpoints from before them."""

from __future__ import annotations

import base64
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from torch import nn

import recovery
from recovery.errors import DigestMismatchError, FormatError, ManifestError, TruncatedFileError
from recovery.format import digests, manifest, shards
from recovery.format.layout import SIGNATURE_FILE, step_dir_name
from recovery.integrity.commits import commit
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import reader
from recovery.state import snapshot

FIXTURE = Path(__file__).parents[1] / "fixtures" / "format-v1"


def sized(*nbytes: int) -> dict[str, torch.Tensor]:
    """Float32 tensors ``t0, t1, ...`` of the given byte sizes, in that order."""
    return {f"t{i}": torch.arange(n // 4, dtype=torch.float32) + i for i, n in enumerate(nbytes)}


@pytest.mark.parametrize(
    ("sizes", "max_bytes", "groups"),
    [
        ((400, 400, 400), 0, [3]),  # 0: never shard
        ((400, 400, 400), 1200, [3]),  # fits
        ((400, 400, 400, 400), 800, [2, 2]),  # balanced halves
        ((400,) * 6, 1000, [2, 2, 2]),  # 3 shards of the 2400 bytes, not 1000 + 1000 + 400
        ((4000, 40, 40), 1000, [1, 2]),  # a tensor past the limit has a shard of its own
        ((40, 4000, 40), 1000, [1, 1, 1]),  # ... wherever it stands
    ],
)
def test_split_balances_shards_and_keeps_the_order(sizes, max_bytes, groups):
    tensors = sized(*sizes)
    got = shards.split(tensors, max_bytes)
    assert [len(g) for g in got] == groups
    assert [k for g in got for k in g] == list(tensors)  # every tensor once, in order


def test_files_name_shards_the_hugging_face_way_and_index_them():
    out = shards.files("model", sized(400, 400, 400, 400), 800)
    names = list(out)
    assert names == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    index = json.loads(out["model.safetensors.index.json"])  # type: ignore[arg-type]
    assert index["metadata"] == {"total_size": 1600}
    assert index["weight_map"] == {
        "t0": names[0],
        "t1": names[0],
        "t2": names[1],
        "t3": names[1],
    }
    assert list(shards.files("model", sized(400), 800)) == ["model.safetensors"]


def write_checkpoint(tmp_path, signer, tree, **kw) -> Path:
    files = snapshot.encode(tree, step=1, meta={}, shard_bytes=kw.pop("shard_bytes", 0))
    final = tmp_path / step_dir_name(1)
    tmp_path.mkdir(exist_ok=True)
    commit.commit(final, files, {"step": 1}, signer=signer, **kw)
    return final


def tree() -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(32, 32) for _ in range(6)))  # 12 tensors, 25 KB
    return {"model": model.state_dict(), "extra": {"w": torch.randn(300), "n": 3}}


def test_a_sharded_checkpoint_decodes_to_the_same_tensors_as_one_file(tmp_path, signer, trust):
    whole = write_checkpoint(tmp_path / "a", signer, tree())
    split = write_checkpoint(tmp_path / "b", signer, tree(), shard_bytes=4096)
    names = sorted(p.name for p in split.iterdir())
    index = json.loads((split / "model.safetensors.index.json").read_bytes())
    shard_files = sorted(set(index["weight_map"].values()))
    assert len(shard_files) == 7  # ceil(25344 bytes / 4096)
    assert shard_files[0] == "model-00001-of-00007.safetensors"
    assert set(shard_files) < set(names)
    assert "model.safetensors" not in names
    assert "extra.safetensors" in names  # 1200 bytes: under the shard size, one file
    a = snapshot.decode(reader.read_verified(whole, trust)).tree
    b = snapshot.decode(reader.read_verified(split, trust)).tree
    assert list(a["model"]) == list(b["model"])
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert torch.equal(a["extra"]["w"], b["extra"]["w"])
    assert b["extra"]["n"] == 3


def forge(tmp_path, signer, mutate) -> Path:
    """A validly signed checkpoint whose index ``mutate`` rewrote (a bad or malicious
    writer: the signature proves who wrote it, not that the writer was right)."""
    files = snapshot.encode(tree(), step=1, meta={}, shard_bytes=4096)
    index = json.loads(files["model.safetensors.index.json"])  # type: ignore[arg-type]
    mutate(index, files)
    files["model.safetensors.index.json"] = json.dumps(index).encode()
    final = tmp_path / step_dir_name(1)
    commit.commit(final, files, {"step": 1}, signer=signer)
    return final


def _drop_shard(index, files):
    del files["model-00002-of-00007.safetensors"]


def _unindex_shard(index, files):
    wm = index["weight_map"]
    index["weight_map"] = {k: v for k, v in wm.items() if v != "model-00002-of-00007.safetensors"}


def _swap(index, files):
    wm = index["weight_map"]
    first, last = sorted(wm)[0], sorted(wm)[-1]
    wm[first], wm[last] = wm[last], wm[first]


def _foreign(index, files):
    index["weight_map"]["0.weight"] = "../evil.safetensors"


@pytest.mark.parametrize(
    ("mutate", "says"),
    [
        (_drop_shard, "names shard model-00002-of-00007.safetensors, which the checkpoint does"),
        (_unindex_shard, "expected 00001..N of N"),
        (_swap, "its index lists"),
        (_foreign, "not a shard of model"),
        (lambda index, files: index.pop("weight_map"), "no weight_map"),
    ],
)
def test_an_index_that_disagrees_with_its_shards_is_refused_by_name(
    tmp_path, signer, trust, mutate, says
):
    final = forge(tmp_path, signer, mutate)
    with pytest.raises(FormatError, match=says) as err:
        snapshot.decode(reader.read_verified(final, trust))
    assert "model" in str(err.value)


def test_parallel_verification_reports_the_first_damaged_file_in_listed_order(
    tmp_path, signer, trust
):
    final = write_checkpoint(tmp_path, signer, tree(), shard_bytes=4096)
    listed = [r.name for r in reader.read_manifest(final, trust).files]
    late, early = listed[-2], listed[1]
    for name in (late, early):  # same size, other bytes
        data = bytearray((final / name).read_bytes())
        data[-1] ^= 0xFF
        (final / name).write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match=early.replace(".", r"\.")):
        reader.read_verified(final, trust)
    # a size difference anywhere is found before any digest (sizes are checked first)
    (final / late).write_bytes((final / late).read_bytes()[:-4])
    with pytest.raises(TruncatedFileError, match=late.replace(".", r"\.")):
        reader.read_verified(final, trust)


def test_a_blake3_checkpoint_names_its_hash_and_verifies(tmp_path, signer, trust):
    final = write_checkpoint(tmp_path, signer, tree(), shard_bytes=4096, hash_type="blake3")
    mf = reader.read_manifest(final, trust)
    assert mf.hash_type == "blake3"
    bundle = json.loads((final / SIGNATURE_FILE).read_bytes())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    assert statement["predicate"]["serialization"]["hash_type"] == "blake3"
    assert {r["algorithm"] for r in statement["predicate"]["resources"]} == {"blake3"}
    import blake3

    for rec in mf.files:  # make test installs blake3 (the all extra): no skip
        assert rec.digest == blake3.blake3((final / rec.name).read_bytes()).hexdigest()
    snapshot.decode(reader.read_verified(final, trust))
    data = bytearray((final / mf.files[0].name).read_bytes())
    data[-1] ^= 1
    (final / mf.files[0].name).write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match="expected blake3"):
        reader.read_verified(final, trust)


def test_a_manifest_mixing_hashes_is_refused(tmp_path):
    rec = manifest.FileRecord("a", "00" * 32, 1)
    st = manifest.build("step-00000001", [rec], {"step": 1}, hash_type="sha256")
    st["predicate"]["serialization"]["hash_type"] = "blake3"
    with pytest.raises(ManifestError, match="uses 'sha256', expected the serialization's blake3"):
        manifest.parse(manifest.payload(st), where=tmp_path)
    st["predicate"]["serialization"]["hash_type"] = "md5"
    with pytest.raises(ManifestError, match="hash_type 'md5'"):
        manifest.parse(manifest.payload(st), where=tmp_path)


def test_digests_refuse_an_unknown_algorithm():
    with pytest.raises(FormatError, match="expected one of sha256, blake3"):
        digests.new("md5")


def test_config_refuses_an_unknown_hash_and_a_negative_shard_size():
    with pytest.raises(recovery.ConfigError, match="checkpoint.hash"):
        recovery.CheckpointConfig(hash="md5")
    with pytest.raises(recovery.ConfigError, match="checkpoint.shard_mb"):
        recovery.CheckpointConfig(shard_mb=-1)


def fixture_module():
    spec = importlib.util.spec_from_file_location("make_fixture", FIXTURE / "make_fixture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_checkpoint_from_before_sharding_still_verifies_and_resumes_exactly(tmp_path, signer):
    """The format-v1 fixture (one file per component, written by the previous release)
    verifies, restores the state it recorded bitwise, and a run resumed from it trains
    on exactly as the uninterrupted run does."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURE / step_dir_name(3), run / step_dir_name(3))
    trust = TrustStore.from_paths([FIXTURE / "recovery.pub"])
    trust.add_pem(signer.public_pem, source="test key")
    assert not any(shards.INDEX_SUFFIX in p.name for p in (run / step_dir_name(3)).iterdir())
    mf = reader.read_manifest(run / step_dir_name(3), trust)
    assert mf.hash_type == "sha256"

    from safetensors.torch import load_file  # an independent reader of the recorded bytes

    fx = fixture_module()
    ref_model, ref_opt, _ = fx.build()
    fx.train(ref_model, ref_opt, 5)  # the uninterrupted run, 5 steps, on this machine

    model, opt, state = fx.build()
    cfg = recovery.CheckpointConfig(every_steps=100, shard_mb=0.0001)
    kw = {"signer": signer, "trust": trust, "preemption": False, "health": False}
    with recovery.Checkpointer(cfg, run, final_step=5, **kw) as ckpt:
        assert ckpt.restore(state, "latest") == 3
        recorded = load_file(FIXTURE / step_dir_name(3) / "model.safetensors")
        for key, value in model.state_dict().items():
            assert torch.equal(value, recorded[key]), key  # restored bitwise as recorded
        fx.train(model, opt, 2)
        ckpt.maybe_save(state, 5)
    # The fixture was written on another CPU, whose kernels may round the last bit of
    # a step differently (seen: 3e-8 after 3 steps between AVX2 and AVX-512 machines),
    # so the run resumed from it is compared with this machine's uninterrupted run to a
    # few ULPs; a resume that lost the optimizer's moments is orders of magnitude off.
    lost, fresh_opt, _ = fx.build()
    lost.load_state_dict(recorded)
    fx.train(lost, fresh_opt, 2)
    for key, value in ref_model.state_dict().items():
        assert torch.allclose(model.state_dict()[key], value, rtol=0, atol=1e-6), key
    assert any(
        not torch.allclose(lost.state_dict()[k], v, rtol=0, atol=1e-4)
        for k, v in ref_model.state_dict().items()
    )
    # the new checkpoint beside the old one is sharded, and both verify
    names = {p.name for p in (run / step_dir_name(5)).iterdir()}
    assert "model.safetensors.index.json" in names
    for step in (3, 5):
        reader.read_verified(run / step_dir_name(step), trust)


def test_blake3_is_refused_under_torchrun_at_start_up():
    from recovery.parallel import multirank
    from recovery.parallel.world import World

    two = World(rank=0, size=2, distributed=True)
    with pytest.raises(recovery.ConfigError, match="checkpoint.hash=blake3 is not supported"):
        multirank.check_supported(two, async_save=False, warm_start_every=0, hash_type="blake3")


def test_deferred_files_are_size_checked_now_and_verified_when_read(tmp_path, signer, trust):
    final = write_checkpoint(tmp_path, signer, tree(), shard_bytes=4096)
    lazy = "model-00003-of-00007.safetensors"
    data = bytearray((final / lazy).read_bytes())
    data[-1] ^= 0xFF
    (final / lazy).write_bytes(bytes(data))
    verified = reader.read_verified(final, trust, defer=lambda name: name == lazy)
    deferred = verified.files[lazy]
    assert isinstance(deferred, reader.Deferred)  # not read: the damage is not seen yet
    with pytest.raises(DigestMismatchError, match=lazy.replace(".", r"\.")):
        deferred.read()
    (final / lazy).write_bytes(bytes(data[:-1]))
    with pytest.raises(TruncatedFileError):  # sizes are checked for deferred files too
        reader.read_verified(final, trust, defer=lambda name: name == lazy)


@pytest.mark.parametrize(
    ("name", "shard"),
    [
        ("dcp/__0_0.distcp", True),
        ("dcp/__1_0.distcp", True),
        ("dcp/.metadata", False),  # every rank plans its reads from it: verified up front
        ("ranks/rank-00000.safetensors", False),
        ("model.safetensors", False),
        ("state.json", False),
    ],
)
def test_only_dcp_data_files_are_verified_lazily_under_torchrun(name, shard):
    from recovery.format.layout import is_dcp_shard

    assert is_dcp_shard(name) is shard
