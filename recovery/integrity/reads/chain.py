"""A differential checkpoint's base: named in its signed statement, verified with it.

A delta (``checkpoint.differential``) holds only the rows of its tables that
changed since a full checkpoint of the same run, its *base*. Its signed
statement names the base by directory name, step and subject digest
(:func:`reference`); :func:`read_base` finds the base beside the delta,
verifies it whole (signature, trust, every file) and checks it is the very
checkpoint the delta signed, so verifying a delta verifies its chain. A base
is always full: a chain is one base and one delta, never longer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from recovery.errors import BrokenChainError, ManifestError, RecoveryError
from recovery.format.layout import SIGNATURE_FILE, parse_step
from recovery.format.manifest import Manifest


class Read(Protocol):
    """What a verifier hands back: at least the verified manifest."""

    @property
    def manifest(self) -> Manifest: ...


V = TypeVar("V", bound=Read)

BASE = "base"
"""The statement's (``recovery`` predicate) field naming a delta's base."""


@dataclass(frozen=True)
class Base:
    """What a delta names as its base."""

    name: str
    """The base's directory name (``step-00000100``), beside the delta."""
    step: int
    digest: str
    """The base's subject digest (sha256 over its file digests)."""

    def record(self) -> dict[str, Any]:
        """The statement's ``base`` field."""
        return {"name": self.name, "step": self.step, "digest": self.digest}


def reference(mf: Manifest, path: Path) -> Base:
    """How a delta names the committed full checkpoint ``path`` (manifest ``mf``)."""
    return Base(name=path.name, step=mf.step, digest=mf.root)


def base_of(mf: Manifest, where: Path) -> Base | None:
    """The base the manifest of the checkpoint ``where`` names (``None``: a full checkpoint).

    Raises:
        ManifestError: the ``base`` field is malformed (or names no step directory).
    """
    field = mf.recovery.get(BASE)
    if field is None:
        return None
    try:
        base = Base(name=str(field["name"]), step=int(field["step"]), digest=str(field["digest"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ManifestError(
            f"{where / SIGNATURE_FILE}: malformed base record {field!r} ({err}); resume from "
            "another checkpoint",
            path=where / SIGNATURE_FILE,
        ) from err
    if parse_step(base.name) != base.step:
        raise ManifestError(
            f"{where / SIGNATURE_FILE}: its base record names {base.name!r}, expected the "
            f"directory of step {base.step}; resume from another checkpoint",
            path=where / SIGNATURE_FILE,
        )
    return base


def base_path(delta: Path, base: Base) -> Path:
    """Where the base of the delta at ``delta`` lives: beside it (``.`` included: made
    absolute, not resolved, so a symlink on the way is still refused)."""
    return delta.absolute().parent / base.name


def read_base(delta: Path, mf: Manifest, verify: Callable[[Path], V]) -> V | None:
    """The verified base of the delta at ``delta`` (``None`` when ``mf`` is a full checkpoint),
    as ``verify`` verifies a directory (:func:`recovery.integrity.reads.reader.read_verified`, or
    :func:`recovery.integrity.reads.hashonly.check`, with the trust settings of the delta's).

    Raises:
        BrokenChainError: the base is missing, fails verification (its error quoted), is
            not the checkpoint the delta signed, or is itself a delta.
        ManifestError: the delta's base record is malformed.
    """
    base = base_of(mf, delta)
    if base is None:
        return None
    where = base_path(delta, base)
    what = f"{delta}: is a delta of {base.name} (step {base.step})"
    if not where.is_dir():
        raise BrokenChainError(
            f"{what}, which is missing; a delta holds only the rows changed since its base. "
            "Restore the base (dvc pull, or from a copy), or resume from another checkpoint",
            base=where,
            path=where,
        )
    try:
        verified = verify(where)
    except RecoveryError as err:
        raise BrokenChainError(
            f"{what}, which fails verification ({err}); resume from another checkpoint",
            base=where,
            path=err.path or where,
        ) from err
    if verified.manifest.root != base.digest:
        raise BrokenChainError(
            f"{what} with digest {base.digest}, but {where} has digest "
            f"{verified.manifest.root}: it was replaced by another checkpoint of that step. "
            "Resume from another checkpoint",
            base=where,
            path=where,
        )
    if base_of(verified.manifest, where) is not None:
        raise BrokenChainError(
            f"{what}, which is itself a delta; a base must be a full checkpoint",
            base=where,
            path=where,
        )
    return verified
