"""A differential checkpoint's base: named in its signed statement, verified with it.

A delta (``checkpoint.differential``) holds only the rows of its tables that
changed since an earlier checkpoint of the same run, its *base*: the previous
checkpoint (itself a delta, or full), or the last full one
(``checkpoint.differential.against``). Its signed statement names the base by
directory name, step and subject digest (:func:`reference`); :func:`read_chain`
finds each link's base beside it, verifies it whole (signature, trust, every
file), checks it is the very checkpoint the link signed and of an earlier
step, and goes on down to a full checkpoint, so verifying a delta verifies its
whole chain. A chain is at most :data:`MAX_LINKS` checkpoints long.
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
MAX_LINKS = 1000
"""The most deltas a chain may hold above its full checkpoint (a writer bounds its chains
by ``checkpoint.differential.full_every``; a longer one is damage or forgery)."""


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


def named(delta: Path, mf: Manifest, read: Callable[[Path], Manifest]) -> list[Base]:
    """The bases the chain below the checkpoint at ``delta`` names, its own base first, each
    link's manifest read (not verified: a caller that only keeps or copies) with ``read``;
    it stops at a link that is missing or does not read, or past :data:`MAX_LINKS`."""
    out: list[Base] = []
    where, manifest = delta, mf
    while len(out) <= MAX_LINKS:
        try:
            base = base_of(manifest, where)
            if base is None or base.step >= manifest.step:
                break
            out.append(base)
            where = base_path(where, base)
            manifest = read(where)
        except (RecoveryError, OSError):
            break
    return out


def read_chain(
    delta: Path,
    mf: Manifest,
    verify: Callable[[Path], V],
    fetch: Callable[[Path, Manifest], None] | None = None,
) -> list[V]:
    """The verified bases of the checkpoint at ``delta`` (manifest ``mf``), the full one
    first and the delta's own base last (empty: ``mf`` is a full checkpoint), each as
    ``verify`` verifies a directory (:func:`recovery.integrity.reads.reader.read_verified`,
    or :func:`recovery.integrity.reads.hashonly.check`, with the trust settings of the
    delta's). ``fetch(path, manifest)`` brings a link's base from DVC first when it is only
    tracked there.

    Raises:
        BrokenChainError: a base is missing, fails verification (its error quoted), is not
            the checkpoint its delta signed, is not of an earlier step, or the chain is
            longer than :data:`MAX_LINKS`.
        ManifestError: a base record is malformed.
    """
    links: list[V] = []
    where, manifest = delta, mf
    while (base := base_of(manifest, where)) is not None:
        if fetch is not None:
            fetch(where, manifest)
        verified = _verified_base(where, base, verify)
        if base.step >= manifest.step or len(links) >= MAX_LINKS:
            raise BrokenChainError(
                f"{where}: is a delta of {base.name} (step {base.step}), which is not an "
                f"earlier checkpoint of a chain of at most {MAX_LINKS} deltas; resume from "
                "another checkpoint",
                base=base_path(where, base),
                path=base_path(where, base),
            )
        links.append(verified)
        where, manifest = base_path(where, base), verified.manifest
    return links[::-1]


def _verified_base(delta: Path, base: Base, verify: Callable[[Path], V]) -> V:
    """The base ``base`` that the delta at ``delta`` names, found beside it and verified."""
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
    return verified
