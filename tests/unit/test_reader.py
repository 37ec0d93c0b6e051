"""Every kind of bad input gets its own error, raised before anything is loaded.

Each case damages a committed checkpoint, then asks a Checkpointer to resume
from it into a fresh TrainState, and checks both the specific error and that
the state (weights, optimizer, sampler, RNG) is exactly as it was.
"""

import hashlib
import os
import pickle

import pytest
import torch

from recovery.config import CheckpointConfig
from recovery.errors import (
    CheckpointNotFoundError,
    DigestMismatchError,
    ExtraFileError,
    FormatError,
    IncompatibleStateError,
    ManifestError,
    MissingFileError,
    PurposeError,
    SignatureError,
    TruncatedFileError,
    UnsafePathError,
    UntrustedSignerError,
)
from recovery.format.layout import SIGNATURE_FILE
from recovery.integrity.reads import reader
from recovery.run.checkpointer import Checkpointer
from recovery.run.restoring import checked
from recovery.state import rng, snapshot
from tests.conftest import make_signer, resign, tiny_state

FILES = [
    "model.safetensors",
    "optimizer.safetensors",
    "rng.safetensors",
    "state.json",
    "config.yaml",
]


def fingerprint(state):
    model = state.components["model"].state_dict()
    return (
        {k: v.clone() for k, v in model.items()},
        state.components["optimizer"].state_dict()["state"].copy(),
        state.components["sampler"].state_dict(),
        rng.capture()["torch"].clone(),
    )


def assert_refused(path, trust, signer, error, match=None, *, width=4, use=False):
    """Resume from ``path`` must raise ``error`` and leave a fresh state untouched; the
    verification of ``recovery ls`` and ``verify``, which decodes no tensor, must refuse it
    the same way (unless ``use``: a refusal only resuming makes, of the purpose, the model's
    shapes, a temp directory that a starting run removes)."""
    if not use:
        with pytest.raises(error, match=match):
            checked.check(path, trust)
    state = tiny_state(seed=1, width=width)
    before = fingerprint(state)
    ck = Checkpointer(
        CheckpointConfig(root=str(path.parent.parent)),
        path.parent,
        final_step=10,
        signer=signer,
        trust=trust,
        provenance={"tool": {}},
    )
    with pytest.raises(error, match=match):
        ck.restore(state, str(path))
    after = fingerprint(state)
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    assert before[1].keys() == after[1].keys() and before[2] == after[2]
    assert torch.equal(before[3], after[3])


def test_verified_bytes_decode(checkpoint, trust):
    path, _ = checkpoint
    v = reader.read_verified(path, trust)
    assert set(v.files) == set(FILES)
    assert snapshot.decode(v).step == 3
    assert v.manifest.signer.trusted and v.manifest.purpose == "continuation"


@pytest.mark.parametrize("name", FILES)
def test_flipped_byte_in_each_file(checkpoint, trust, signer, name):
    path, _ = checkpoint
    f = path / name
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    assert_refused(path, trust, signer, DigestMismatchError, name)


def test_flipped_byte_in_signature(checkpoint, trust, signer):
    path, _ = checkpoint
    f = path / SIGNATURE_FILE
    text = f.read_text()
    i = text.index('"sig": "') + 20
    f.write_text(text[:i] + ("A" if text[i] != "A" else "B") + text[i + 1 :])
    assert_refused(path, trust, signer, SignatureError)


def test_truncated_file(checkpoint, trust, signer):
    path, _ = checkpoint
    f = path / "optimizer.safetensors"
    os.truncate(f, f.stat().st_size - 10)
    assert_refused(path, trust, signer, TruncatedFileError, "expected .* bytes, found")


def test_deleted_file(checkpoint, trust, signer):
    path, _ = checkpoint
    (path / "rng.safetensors").unlink()
    assert_refused(path, trust, signer, MissingFileError, "rng.safetensors")


def test_extra_file(checkpoint, trust, signer):
    path, _ = checkpoint
    (path / "notes.txt").write_text("hi")
    assert_refused(path, trust, signer, ExtraFileError, "notes.txt")


@pytest.mark.parametrize("extra", ["empty", "nested/empty"])
def test_an_unlisted_directory_is_refused_even_empty(checkpoint, trust, signer, extra):
    path, _ = checkpoint
    (path / extra).mkdir(parents=True)
    assert_refused(path, trust, signer, ExtraFileError, extra.split("/")[0] + "/")


def test_signature_by_an_untrusted_key(checkpoint, trust, signer, tmp_path):
    path, _ = checkpoint
    mallory = make_signer(tmp_path / "mallory")
    resign(path, mallory, lambda st: None)
    assert_refused(path, trust, signer, UntrustedSignerError, "not in the trust store")


def test_untrusted_allowed_explicitly_still_checks_the_signature(checkpoint, trust, tmp_path):
    path, _ = checkpoint
    other = make_signer(tmp_path / "other")
    resign(path, other, lambda st: st["predicate"]["recovery"].update(signer=other.describe()))
    v = reader.read_verified(path, trust, allow_untrusted=True)
    assert not v.manifest.signer.trusted and v.manifest.signer.key_id == other.key_id


def test_payload_edited_signature_kept(checkpoint, trust, signer):
    """A digest in the statement changed but the signature was not redone."""
    import base64
    import json

    path, _ = checkpoint
    f = path / SIGNATURE_FILE
    bundle = json.loads(f.read_bytes())
    st = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    st["predicate"]["resources"][0]["digest"] = "00" * 32
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(st).encode()).decode()
    f.write_text(json.dumps(bundle))
    assert_refused(path, trust, signer, SignatureError, "does not verify")


@pytest.mark.parametrize("bad", ["../escape.json", "/etc/passwd"])
def test_manifest_entry_escaping_the_dir(checkpoint, trust, signer, bad):
    path, _ = checkpoint
    resign(path, signer, lambda st: st["predicate"]["resources"][0].update(name=bad))
    assert_refused(path, trust, signer, UnsafePathError, "plain relative path")


def test_symlink_inside(checkpoint, trust, signer, tmp_path):
    path, _ = checkpoint
    (tmp_path / "outside").write_text("x")
    os.symlink(tmp_path / "outside", path / "link")
    assert_refused(path, trust, signer, UnsafePathError, "symlink")


def test_listed_file_replaced_by_symlink(checkpoint, trust, signer, tmp_path):
    path, _ = checkpoint
    target = tmp_path / "copy"
    target.write_bytes((path / "state.json").read_bytes())
    (path / "state.json").unlink()
    os.symlink(target, path / "state.json")
    assert_refused(path, trust, signer, UnsafePathError)


def test_missing_signature_means_uncommitted(checkpoint, trust, signer):
    path, _ = checkpoint
    (path / SIGNATURE_FILE).unlink()
    assert_refused(path, trust, signer, ManifestError, "never committed")


def test_pickle_under_safetensors_name_is_never_unpickled(checkpoint, trust, signer, tmp_path):
    """Even signed by a trusted key with matching hashes, the planted pickle only fails to parse."""
    path, _ = checkpoint
    canary = tmp_path / "PWNED"

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {canary}",))

    payload = pickle.dumps(Boom())
    (path / "model.safetensors").write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()

    def edit(st):
        for r in st["predicate"]["resources"]:
            if r["name"] == "model.safetensors":
                r["digest"] = digest
        st["predicate"]["recovery"]["sizes"]["model.safetensors"] = len(payload)

    resign(path, signer, edit)
    assert_refused(path, trust, signer, FormatError, "model.safetensors")
    assert not canary.exists()


def test_wrong_purpose_for_the_use(checkpoint, trust, signer):
    path, _ = checkpoint
    resign(
        path,
        signer,
        lambda st: st["predicate"]["recovery"].update(purpose="warm_start", requires=[]),
    )
    assert_refused(
        path,
        trust,
        signer,
        PurposeError,
        "is a 'warm_start' artifact; resume needs continuation",
        use=True,
    )


def test_purpose_contract_not_met(checkpoint, trust, signer):
    path, _ = checkpoint
    resign(
        path,
        signer,
        lambda st: st["predicate"]["recovery"].update(requires=["model", "io_signature"]),
    )
    assert_refused(path, trust, signer, PurposeError, r"lacks \['io_signature'\]")


def test_model_shape_mismatch(checkpoint, trust, signer):
    path, _ = checkpoint
    assert_refused(
        path, trust, signer, IncompatibleStateError, r"checkpoint shape \(4, 3\)", width=6, use=True
    )


def test_renamed_directory_is_refused(checkpoint, trust, signer):
    path, _ = checkpoint
    moved = path.with_name("step-00000009")
    path.rename(moved)
    assert_refused(moved, trust, signer, ManifestError, "says step 9, its manifest says step 3")


def test_temp_directory_is_never_trusted(checkpoint, trust, signer):
    path, _ = checkpoint
    moved = path.with_name(path.name + ".tmp-0123abcd")
    path.rename(moved)
    with pytest.raises(ManifestError, match="never committed"):
        reader.read_verified(moved, trust)
    # and a starting run removes it rather than resuming from it
    assert_refused(moved, trust, signer, CheckpointNotFoundError, use=True)
