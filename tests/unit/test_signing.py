"""Key identity is the key: a trusted key file's formatting never changes who signed."""

import hashlib
import subprocess

import pytest

from recovery import cli
from recovery.integrity.keys.signing import TrustStore, pem_key_id
from recovery.integrity.reads import reader

VARIANTS = {
    "as written": lambda pem: pem,
    "comment line": lambda pem: b"# the team's signing key, 2026\n" + pem,
    "CRLF": lambda pem: pem.replace(b"\n", b"\r\n"),
    "trailing blank line": lambda pem: pem + b"\n\n",
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_trusted_key_file_is_the_same_key_however_it_is_formatted(
    checkpoint, signer, tmp_path, variant
):
    path, _ = checkpoint
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "team.pub").write_bytes(VARIANTS[variant](signer.public_pem))
    store = TrustStore.from_paths([trusted])
    assert store.get(signer.key_id) is not None and len(store) == 1
    assert reader.read_verified(path, store).manifest.signer.trusted
    assert cli.main(["verify", str(path), "--trusted", str(trusted)]) == 0


def test_the_key_id_is_what_model_signing_computes_from_the_key(signer, tmp_path):
    # openssl re-encodes the key canonically, as model_signing does before hashing
    (tmp_path / "odd.pub").write_bytes(VARIANTS["CRLF"](signer.public_pem))
    pem = subprocess.run(
        ["openssl", "pkey", "-pubin", "-in", str(tmp_path / "odd.pub"), "-outform", "PEM"],
        capture_output=True,
        check=True,
    ).stdout
    assert signer.key_id == hashlib.sha256(pem).hexdigest()
    assert pem_key_id(VARIANTS["comment line"](signer.public_pem), where="x") == signer.key_id
