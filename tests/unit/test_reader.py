"""Every kind of damage to a committed checkpoint gets its own error, and nothing is decoded."""

import json
import os
import pickle

import pytest

from recovery import manifest, reader, snapshot
from recovery.errors import (
    DigestMismatchError,
    ExtraFileError,
    FormatError,
    ManifestError,
    MissingFileError,
    TruncatedFileError,
    UnsafePathError,
)
from recovery.layout import MANIFEST_FILE


def test_verified_bytes_decode(checkpoint):
    path, _ = checkpoint
    v = reader.read_verified(path)
    assert set(v.files) == {
        "model.safetensors",
        "optimizer.safetensors",
        "rng.safetensors",
        "state.json",
        "config.yaml",
    }
    assert snapshot.decode(v).step == 3


@pytest.mark.parametrize(
    "name",
    ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json", "config.yaml"],
)
def test_flipped_byte_in_each_file(checkpoint, name):
    path, _ = checkpoint
    f = path / name
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    with pytest.raises(DigestMismatchError, match=name):
        reader.read_verified(path)


def test_truncated_file(checkpoint):
    path, _ = checkpoint
    f = path / "optimizer.safetensors"
    os.truncate(f, f.stat().st_size - 10)
    with pytest.raises(TruncatedFileError, match="expected .* bytes, found"):
        reader.read_verified(path)


def test_deleted_file(checkpoint):
    path, _ = checkpoint
    (path / "rng.safetensors").unlink()
    with pytest.raises(MissingFileError, match="rng.safetensors"):
        reader.read_verified(path)


def test_extra_file(checkpoint):
    path, _ = checkpoint
    (path / "notes.txt").write_text("hi")
    with pytest.raises(ExtraFileError, match="notes.txt"):
        reader.read_verified(path)


def test_symlink_inside(checkpoint, tmp_path):
    path, _ = checkpoint
    (tmp_path / "outside").write_text("x")
    os.symlink(tmp_path / "outside", path / "link")
    with pytest.raises(UnsafePathError, match="symlink"):
        reader.read_verified(path)


def test_listed_file_replaced_by_symlink(checkpoint, tmp_path):
    path, _ = checkpoint
    target = tmp_path / "copy"
    target.write_bytes((path / "state.json").read_bytes())
    (path / "state.json").unlink()
    os.symlink(target, path / "state.json")
    with pytest.raises(UnsafePathError):
        reader.read_verified(path)


def test_missing_manifest_means_uncommitted(checkpoint):
    path, _ = checkpoint
    (path / MANIFEST_FILE).unlink()
    with pytest.raises(ManifestError, match="never committed"):
        reader.read_verified(path)


def _rewrite_manifest(path, edit):
    st = json.loads((path / MANIFEST_FILE).read_text())
    edit(st)
    res = st["predicate"]["resources"]
    recs = [manifest.FileRecord(r["name"], r["digest"], 0) for r in res]
    st["subject"][0]["digest"]["sha256"] = manifest.root_digest(recs)
    (path / MANIFEST_FILE).write_text(json.dumps(st))


@pytest.mark.parametrize("bad", ["../escape.json", "/etc/passwd"])
def test_manifest_entry_escaping_the_dir(checkpoint, bad):
    path, _ = checkpoint
    _rewrite_manifest(path, lambda st: st["predicate"]["resources"][0].update(name=bad))
    with pytest.raises(UnsafePathError, match="plain relative path"):
        reader.read_verified(path)


def test_pickle_under_safetensors_name_is_never_unpickled(checkpoint):
    """Even with a manifest that hashes it correctly, the planted pickle only fails to parse."""
    path, _ = checkpoint

    class Boom:
        def __reduce__(self):
            return (os.system, ("touch PWNED",))

    payload = pickle.dumps(Boom())
    (path / "model.safetensors").write_bytes(payload)
    import hashlib

    digest = hashlib.sha256(payload).hexdigest()

    def edit(st):
        for r in st["predicate"]["resources"]:
            if r["name"] == "model.safetensors":
                r["digest"] = digest
        st["predicate"]["recovery"]["sizes"]["model.safetensors"] = len(payload)

    _rewrite_manifest(path, edit)
    v = reader.read_verified(path)
    with pytest.raises(FormatError, match="model.safetensors"):
        snapshot.decode(v)
    assert not (path / "PWNED").exists() and not os.path.exists("PWNED")


def test_renamed_directory_is_refused(checkpoint):
    path, _ = checkpoint
    moved = path.with_name("step-00000009")
    path.rename(moved)
    with pytest.raises(ManifestError, match="says step 9, its manifest says step 3"):
        reader.read_verified(moved)


def test_temp_directory_is_never_trusted(checkpoint):
    path, _ = checkpoint
    moved = path.with_name(path.name + ".tmp-0123abcd")
    path.rename(moved)
    with pytest.raises(ManifestError, match="never committed"):
        reader.read_verified(moved)
