"""ECDSA keys, DSSE signature bundles in the OpenSSF model-signing v1.0 format, trust.

A signature is a Sigstore bundle (``model.sig``) holding a DSSE envelope whose
payload is the in-toto statement built by :mod:`recovery.format.manifest`. The
signature is ECDSA (P-256 with SHA-256; P-384/P-521 accepted) in DER over the
DSSE pre-authentication encoding, made with RFC 6979 deterministic nonces so
that signing the same statement twice gives the same bytes. The bundle names
the signer by ``verificationMaterial.publicKey.hint``: the hex sha256 of the
signer's PEM public key, which is also our key id. ``model_signing verify key``
accepts these bundles with no code of ours.

Trust is a set of public keys (:class:`TrustStore`). A bundle from a key in
the store is verified with that key. A bundle from any other key is refused
(:class:`~recovery.errors.UntrustedSignerError`) unless the caller explicitly
allows untrusted signers; then it is verified against the public key embedded
in the signed statement, which proves the bytes are intact since signing but
not who signed them.

Rejected: Ed25519 (model-signing 1.1.1 refuses it) and randomized ECDSA
(re-signing an unchanged artifact would change its bytes and its DVC hash).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import exceptions as crypto_exc
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from recovery import access
from recovery.errors import SignatureError, SigningKeyError, UntrustedSignerError
from recovery.format import bounded
from recovery.format.manifest import SignatureCheck
from recovery.integrity import nofollow

log = logging.getLogger(__name__)

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
MAX_BUNDLE_BYTES = 64 << 20
"""A ``model.sig`` larger than this is refused unread (ours are kilobytes; a DCP checkpoint's
list of files, a few hundred kilobytes)."""
PRIVATE_KEY_FILE = "recovery.key"
PUBLIC_KEY_FILE = "recovery.pub"
_CURVES: dict[str, type[hashes.SHA256 | hashes.SHA384 | hashes.SHA512]] = {
    "secp256r1": hashes.SHA256,
    "secp384r1": hashes.SHA384,
    "secp521r1": hashes.SHA512,
}
KEY_REMEDY = "or point signing.key (or $RECOVERY_SIGNING_KEY) at a key this user may read"
"""What else fixes a signing key this user may not read (:mod:`recovery.access`)."""
TRUST_REMEDY = "or pass --trusted / signing.trusted with a copy this user may read"
"""What else fixes a trusted key this user may not read."""


def pae(payload: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding of an in-toto payload."""
    return b"DSSEv1 %d %s %d %s" % (len(PAYLOAD_TYPE), PAYLOAD_TYPE.encode(), len(payload), payload)


def public_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    """The PEM (SubjectPublicKeyInfo) encoding of a public key."""
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def key_id(key: ec.EllipticCurvePublicKey) -> str:
    """Key id: hex sha256 of the key's canonical PEM (the bundle's ``publicKey.hint``).

    Derived from the key, never from a file's bytes: the SubjectPublicKeyInfo
    re-encoded as PEM, so a trusted ``.pub`` copied with a comment line, CRLF
    line endings or a trailing blank line is the same key. It is what
    ``model_signing verify key`` computes from the key it is given and
    compares with the hint (the sha256 of the DER would be refused there),
    and what every bundle signed so far carries.
    """
    return hashlib.sha256(public_pem(key)).hexdigest()


def pem_key_id(pem: bytes, *, where: str) -> str:
    """:func:`key_id` of a PEM public key.

    Raises:
        SigningKeyError: not a supported ECDSA public key.
    """
    return key_id(load_public_key(pem, where=where))


def _algorithm(key: ec.EllipticCurvePublicKey, *, where: str) -> ec.ECDSA:
    curve = key.curve.name
    if curve not in _CURVES:
        raise SigningKeyError(
            f"{where}: ECDSA key on curve {curve}; expected P-256, P-384 or P-521 "
            "(create one with `recovery keygen`)"
        )
    return ec.ECDSA(_CURVES[curve](), deterministic_signing=True)


def load_public_key(pem: bytes, *, where: str) -> ec.EllipticCurvePublicKey:
    """Parse a PEM public key, refusing anything but a supported ECDSA curve."""
    try:
        key = serialization.load_pem_public_key(pem)
    except (ValueError, TypeError, crypto_exc.UnsupportedAlgorithm) as err:
        raise SigningKeyError(
            f"{where}: expected a PEM public key, found unreadable data ({err})"
        ) from err
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SigningKeyError(f"{where}: expected an ECDSA public key, found {type(key).__name__}")
    _algorithm(key, where=where)
    return key


def generate_keypair(out_dir: Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Create a P-256 key pair: ``recovery.key`` (PKCS#8 PEM, mode 0600) and ``recovery.pub``.

    Raises:
        SigningKeyError: a key already exists there and ``overwrite`` is false, or
            ``out_dir`` cannot be created or written.
    """
    priv_path, pub_path = out_dir / PRIVATE_KEY_FILE, out_dir / PUBLIC_KEY_FILE
    try:
        nofollow.private_dirs(out_dir)
        return _write_keypair(priv_path, pub_path, overwrite=overwrite)
    except OSError as err:
        what = "is a file, not a directory" if out_dir.is_file() else f"is not writable ({err})"
        raise SigningKeyError(
            f"{out_dir}: {what}; pass a directory you can write to as --out "
            "(it is created if missing)",
            path=out_dir,
        ) from None


def _write_keypair(priv_path: Path, pub_path: Path, *, overwrite: bool) -> tuple[Path, Path]:
    if priv_path.exists() and not overwrite:
        raise SigningKeyError(
            f"{priv_path}: a key already exists; keep it, or pass --force to replace it "
            "(checkpoints signed by it then need its public key in the trust store)",
            path=priv_path,
        )
    key = ec.generate_private_key(ec.SECP256R1())
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    tmp = priv_path.with_name(f".{priv_path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, priv_path)
    pub_path.write_bytes(public_pem(key.public_key()))
    return priv_path, pub_path


class Signer:
    """Signs statements with one ECDSA private key.

    Args:
        key_path: PEM private key (PKCS#8 or traditional, unencrypted).
        dev: whether this is the auto-made local development key.
    """

    def __init__(self, key_path: Path, *, dev: bool = False) -> None:
        try:
            key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        except PermissionError as err:
            raise access.denied(err, "the signing key", KEY_REMEDY) from err
        except OSError as err:
            raise SigningKeyError(
                f"{key_path}: cannot read the signing key ({err})", path=key_path
            ) from err
        except (ValueError, TypeError, crypto_exc.UnsupportedAlgorithm) as err:
            raise SigningKeyError(
                f"{key_path}: expected an unencrypted PEM private key, "
                f"found unreadable data ({err})",
                path=key_path,
            ) from err
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise SigningKeyError(
                f"{key_path}: expected an ECDSA private key, found {type(key).__name__}; "
                "create one with `recovery keygen`",
                path=key_path,
            )
        self._key = key
        self._algorithm = _algorithm(key.public_key(), where=str(key_path))
        self.path = key_path
        self.dev = dev
        self.public_pem = public_pem(key.public_key())
        self.key_id = key_id(key.public_key())

    def describe(self) -> dict[str, Any]:
        """The signer as recorded inside the signed statement."""
        return {"key_id": self.key_id, "public_key": self.public_pem.decode(), "dev": self.dev}

    def sign(self, payload: bytes) -> bytes:
        """The bundle bytes (``model.sig``) signing ``payload``; deterministic."""
        sig = self._key.sign(pae(payload), self._algorithm)
        bundle = {
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": self.key_id}, "tlogEntries": []},
            "dsseEnvelope": {
                "payload": base64.b64encode(payload).decode(),
                "payloadType": PAYLOAD_TYPE,
                "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}],
            },
        }
        return json.dumps(bundle, indent=2, sort_keys=True).encode() + b"\n"

    def sign_bytes(self, data: bytes) -> bytes:
        """A bare DER signature of ``data`` (deterministic): for records that are no
        artifact, such as the journal's events (:mod:`recovery.integrity.keys.seal`)."""
        return self._key.sign(data, self._algorithm)


@dataclass(frozen=True)
class TrustedKey:
    """A public key the store trusts, with where it came from."""

    key_id: str
    key: ec.EllipticCurvePublicKey
    source: str
    dev: bool = False


class TrustStore:
    """The public keys whose signatures are trusted."""

    def __init__(self, keys: Iterable[TrustedKey] = ()) -> None:
        self._keys: dict[str, TrustedKey] = {}
        self.searched: list[str] = []
        """Where the keys were looked for, in order (an untrusted signer's message lists it)."""
        for k in keys:
            self._add(k)

    def _add(self, key: TrustedKey) -> TrustedKey:
        return self._keys.setdefault(key.key_id, key)

    def add_pem(self, pem: bytes, *, source: str, dev: bool = False) -> TrustedKey:
        public = load_public_key(pem, where=source)
        return self._add(TrustedKey(key_id(public), public, source, dev))

    def get(self, kid: str) -> TrustedKey | None:
        return self._keys.get(kid)

    def __len__(self) -> int:
        return len(self._keys)

    def verifies(self, kid: str, data: bytes, sig: bytes) -> bool:
        """Whether ``sig`` is a signature of ``data`` by the trusted key ``kid``."""
        known = self._keys.get(kid)
        if known is None:
            return False
        try:
            known.key.verify(sig, data, _algorithm(known.key, where=known.source))
        except crypto_exc.InvalidSignature:
            return False
        return True

    def with_signer(self, signer: Signer) -> TrustStore:
        """This store and ``signer``'s own public key (a writer trusts what it signed)."""
        store = TrustStore(self._keys.values())
        store.searched = list(self.searched)
        store.add_pem(signer.public_pem, source=str(signer.path), dev=signer.dev)
        return store

    @classmethod
    def from_paths(cls, paths: Iterable[Path], *, dev_keys: Iterable[Path] = ()) -> TrustStore:
        """Trust every ``*.pub``/``*.pem`` public key in ``paths`` (dirs or files).

        Missing paths are skipped; ``dev_keys`` are trusted and marked as dev keys.
        """
        store = cls()
        places = [*((p, False) for p in paths), *((p, True) for p in dev_keys)]
        store.searched = [f"{p}{' (dev key)' if dev else ''}" for p, dev in places]
        for path, dev in places:
            if path.is_dir():
                files = sorted(f for f in path.iterdir() if f.suffix in (".pub", ".pem"))
            elif path.is_file():
                files = [path]
            else:
                continue
            for f in files:
                try:
                    pem = f.read_bytes()
                except PermissionError as err:
                    what = "a dev key" if dev else "a trusted public key"
                    raise access.denied(err, what, TRUST_REMEDY) from err
                store.add_pem(pem, source=str(f), dev=dev)
        return store


def verify_bundle(
    data: bytes, trust: TrustStore, *, where: Path, allow_untrusted: bool = False
) -> SignatureCheck:
    """Check a ``model.sig`` bundle and return its verified payload.

    Raises:
        SignatureError: not a bundle of this format, or the signature does not verify.
        UntrustedSignerError: the signer is not trusted and ``allow_untrusted`` is false.
    """

    def bad(what: str) -> SignatureError:
        return SignatureError(
            f"{where}: {what}. Nothing in the directory is trusted; "
            "resume from another checkpoint.",
            path=where,
        )

    try:
        bundle = bounded.json_loads(data, limit=MAX_BUNDLE_BYTES)
        if bundle["mediaType"] != BUNDLE_MEDIA_TYPE:
            raise bad(f"expected mediaType {BUNDLE_MEDIA_TYPE!r}, found {bundle['mediaType']!r}")
        kid = str(bundle["verificationMaterial"]["publicKey"]["hint"])
        env = bundle["dsseEnvelope"]
        if env["payloadType"] != PAYLOAD_TYPE:
            raise bad(f"expected payloadType {PAYLOAD_TYPE!r}, found {env['payloadType']!r}")
        payload = base64.b64decode(env["payload"], validate=True)
        if len(env["signatures"]) != 1:
            raise bad(f"expected exactly one signature, found {len(env['signatures'])}")
        sig = base64.b64decode(env["signatures"][0]["sig"], validate=True)
    except SignatureError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, binascii.Error) as err:
        raise bad(
            f"expected a model-signing bundle, found malformed data ({type(err).__name__}: {err})"
        ) from err

    known = trust.get(kid)
    if known is not None:
        verifier, trusted, dev, source = known.key, True, known.dev, known.source
    else:
        embedded = _embedded_signer(payload)
        if not allow_untrusted:
            raise UntrustedSignerError(
                f"{where}: signed by key {kid[:16]}… which is not in the trust store "
                f"(looked in: {'; '.join(trust.searched) or 'no keys given'}). If you trust "
                "it, pass its public key: --trusted PATH / signing.trusted=PATH (a dev key's "
                "directory: $RECOVERY_DEV_KEY_DIR or signing.dev_key_dir=), or pass "
                "--allow-untrusted / signing.allow_untrusted=true to accept it knowingly.",
                key_id=kid,
                path=where,
            )
        try:
            public = load_public_key(embedded, where=str(where)) if embedded else None
        except SigningKeyError as err:
            raise bad(f"the statement's signer key is unreadable ({err})") from None
        if public is None or key_id(public) != kid:
            raise bad("signer is untrusted and the statement does not carry its public key")
        verifier, trusted, dev, source = public, False, False, "embedded"
    try:
        verifier.verify(sig, pae(payload), _algorithm(verifier, where=str(where)))
    except crypto_exc.InvalidSignature:
        raise bad(
            f"the signature does not verify with key {kid[:16]}…; the statement was altered"
        ) from None
    log.debug("verified signature of %s by %s (trusted=%s)", where, kid, trusted)
    return SignatureCheck(payload=payload, key_id=kid, trusted=trusted, dev=dev, source=source)


def _embedded_signer(payload: bytes) -> bytes | None:
    try:
        pem = bounded.json_loads(payload)["predicate"]["recovery"]["signer"]["public_key"]
    except (ValueError, KeyError, TypeError):
        return None
    return pem.encode() if isinstance(pem, str) else None
