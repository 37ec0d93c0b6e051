"""The manifest: one statement of what a committed directory holds.

The statement is an in-toto Statement v1 whose predicate follows the OpenSSF
model-signing v1.0 layout (``serialization`` + ``resources`` with one digest
per file, by the ``hash_type`` it names: sha256 by default, or blake3; and
the subject digest = sha256 over the concatenated raw file digests in listed
order, whatever the files' hash). Our own fields ride in one extra predicate field,
``recovery``: format version, step, purpose, run id, file sizes, metrics and,
later, provenance. Verifiers of that format ignore unknown fields.

The statement's canonical JSON (:func:`payload`) is what :mod:`recovery.integrity.keys.signing`
signs into ``model.sig``, the last file written to the directory; the
signature file itself is listed in ``ignore_paths``, as model-signing expects.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from recovery.errors import ManifestError, UnsafePathError
from recovery.format import bounded, digests
from recovery.format.layout import SIGNATURE_FILE

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class SignatureCheck:
    """What verifying a bundle established
    (:func:`recovery.integrity.keys.signing.verify_bundle`)."""

    payload: bytes
    key_id: str
    trusted: bool
    dev: bool
    source: str
    """Where the verifying key came from (trust-store file, or ``embedded`` if untrusted)."""


@dataclass(frozen=True)
class FileRecord:
    """One committed file: relative posix name, hex digest (by the manifest's hash), size."""

    name: str
    digest: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """A parsed, structurally valid statement, and who signed it."""

    subject: str
    root: str
    files: list[FileRecord]
    recovery: dict[str, Any] = field(default_factory=dict)
    signer: SignatureCheck | None = None
    hash_type: str = digests.SHA256
    """The algorithm of every file's digest (:data:`recovery.format.digests.ALGORITHMS`)."""

    @property
    def step(self) -> int:
        return int(self.recovery.get("step", -1))

    @property
    def purpose(self) -> str:
        return str(self.recovery.get("purpose", ""))


def root_digest(files: list[FileRecord]) -> str:
    """sha256 over the concatenated raw digests, in listed order."""
    h = hashlib.sha256()
    for rec in files:
        h.update(bytes.fromhex(rec.digest))
    return h.hexdigest()


def check_relpath(name: str, *, where: Path) -> None:
    """Refuse a manifest name that is not a plain relative path inside the directory.

    Raises:
        UnsafePathError: absolute, ``..``, empty, backslash or non-normal names.
    """
    pure = PurePosixPath(name)
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or pure.is_absolute()
        or ".." in pure.parts
        or str(pure) != name
        or name.startswith("./")
    ):
        raise UnsafePathError(
            f"{where}: manifest lists '{name}', expected a plain relative path inside the "
            "directory; refusing to read outside it. The manifest was not written by this tool.",
            path=where,
        )


def build(
    subject: str,
    files: list[FileRecord],
    recovery: dict[str, Any],
    *,
    hash_type: str = digests.SHA256,
) -> dict[str, Any]:
    """Build the statement for a directory named ``subject`` holding ``files`` (hashed
    with ``hash_type``)."""
    ordered = sorted(files, key=lambda r: r.name)
    extra = dict(recovery)
    extra["format"] = FORMAT_VERSION
    extra["sizes"] = {r.name: r.size for r in ordered}
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject, "digest": {"sha256": root_digest(ordered)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {
                "method": "files",
                "hash_type": hash_type,
                "allow_symlinks": False,
                "ignore_paths": [SIGNATURE_FILE],
            },
            "resources": [
                {"name": r.name, "algorithm": hash_type, "digest": r.digest} for r in ordered
            ],
            "recovery": extra,
        },
    }


def payload(statement: dict[str, Any]) -> bytes:
    """The canonical bytes of a statement: what is signed."""
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def parse(data: bytes, *, where: Path, signer: SignatureCheck | None = None) -> Manifest:
    """Parse and structurally check a statement's payload bytes.

    Raises:
        ManifestError: not JSON, not a statement of this type, or inconsistent.
        UnsafePathError: a resource name escapes the directory.
    """
    file = where / SIGNATURE_FILE

    def bad(what: str) -> ManifestError:
        return ManifestError(
            f"{file}: {what}. The directory cannot be trusted; resume from another checkpoint.",
            path=file,
        )

    try:
        st = bounded.json_loads(data)
    except ValueError as err:
        raise bad(f"expected a JSON in-toto statement, found undecodable bytes ({err})") from err
    if not isinstance(st, dict) or st.get("_type") != STATEMENT_TYPE:
        raise bad(f"expected _type {STATEMENT_TYPE!r}")
    if st.get("predicateType") != PREDICATE_TYPE:
        raise bad(f"expected predicateType {PREDICATE_TYPE!r}, found {st.get('predicateType')!r}")
    try:
        subject = st["subject"][0]
        pred = st["predicate"]
        extra = pred.get("recovery", {})
        sizes = extra.get("sizes", {})
        hash_type = pred["serialization"]["hash_type"]
        if hash_type not in digests.ALGORITHMS:
            raise bad(
                f"serialization hash_type {hash_type!r}, expected one of "
                f"{', '.join(digests.ALGORITHMS)}"
            )
        files = []
        for res in pred["resources"]:
            if res["algorithm"] != hash_type:
                raise bad(
                    f"resource {res['name']!r} uses {res['algorithm']!r}, expected the "
                    f"serialization's {hash_type}"
                )
            size = sizes.get(res["name"])
            files.append(
                FileRecord(
                    res["name"], str(res["digest"]).lower(), int(size) if size is not None else -1
                )
            )
        root = str(subject["digest"]["sha256"]).lower()
        name = str(subject["name"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        raise bad(f"malformed statement ({type(err).__name__}: {err})") from err
    for rec in files:
        check_relpath(rec.name, where=where)
    if len({f.name for f in files}) != len(files):
        raise bad("a resource is listed twice")
    if root_digest(files) != root:
        raise bad(f"subject digest {root} does not match the listed file digests")
    return Manifest(
        subject=name,
        root=root,
        files=files,
        recovery=dict(extra),
        signer=signer,
        hash_type=str(hash_type),
    )
