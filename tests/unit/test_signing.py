"""Key identity is the key: a trusted key file's formatting never changes who signed."""

import json
import os

import pytest

from recovery import cli
from recovery.format.layout import SIGNATURE_FILE
from recovery.integrity import reader
from recovery.integrity.signing import TrustStore, key_id, legacy_key_id

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


def test_the_key_id_is_the_sha256_of_the_public_key_der(signer):
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_public_key(signer.public_pem)
    assert signer.key_id == key_id(key) != legacy_key_id(key)


def test_a_bundle_naming_its_key_the_old_way_still_verifies(checkpoint, signer, trust):
    path, _ = checkpoint
    sig = path / SIGNATURE_FILE
    bundle = json.loads(sig.read_bytes())
    from cryptography.hazmat.primitives import serialization

    old = legacy_key_id(serialization.load_pem_public_key(signer.public_pem))
    bundle["verificationMaterial"]["publicKey"]["hint"] = old  # the hint is not signed
    os.chmod(sig, 0o644)
    sig.write_text(json.dumps(bundle))
    check = reader.read_verified(path, trust).manifest.signer
    assert check.trusted and check.key_id == old
