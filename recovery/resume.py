"""Choose, verify and decode the checkpoint a run resumes from.

``+resume=`` takes ``latest``, a step number, or a path to a checkpoint
directory. ``latest`` walks committed checkpoints newest first and takes the
first that verifies and decodes, warning loudly (file, expected, found) about
each one it passes over; with none at all it returns ``None`` and the run
starts fresh, so the same command line is safe to requeue. A named step or
path must verify, or the resume fails: the user asked for that one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from recovery import reader, snapshot
from recovery.errors import CheckpointNotFoundError, ConfigError, FormatError, VerificationError
from recovery.layout import scan, step_dir_name
from recovery.manifest import Manifest
from recovery.snapshot import Decoded

log = logging.getLogger(__name__)

LATEST = "latest"
BEST = "best"


@dataclass(frozen=True)
class Loaded:
    """A verified, decoded checkpoint chosen for a resume."""

    path: Path
    manifest: Manifest
    decoded: Decoded
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    """Newer checkpoints passed over, with the reason for each."""


def parse_spec(spec: object) -> str | int | Path:
    """Normalise a ``+resume=`` value: ``"latest"``, a step (int) or a path.

    Raises:
        ConfigError: an empty or negative value.
    """
    if isinstance(spec, bool) or spec is None:
        raise ConfigError(f"resume: expected latest, a step number or a path, got {spec!r}")
    if isinstance(spec, int):
        if spec < 0:
            raise ConfigError(f"resume: step must be >= 0, got {spec}")
        return spec
    text = str(spec).strip()
    if not text:
        raise ConfigError("resume: expected latest, a step number or a path, got an empty value")
    if text in (LATEST, BEST):
        return text
    if text.isdigit():
        return int(text)
    return Path(text)


def load(path: Path) -> tuple[Manifest, Decoded]:
    """Verify every byte of ``path``, then decode those bytes."""
    verified = reader.read_verified(path)
    return verified.manifest, snapshot.decode(verified)


def select(run_dir: Path, spec: object) -> Loaded | None:
    """The checkpoint ``spec`` names in ``run_dir``, verified and decoded.

    Returns:
        The loaded checkpoint, or ``None`` when ``spec`` is ``latest`` and no
        checkpoint of the run verifies (the caller starts fresh).

    Raises:
        CheckpointNotFoundError: a named step or path does not exist.
        VerificationError, FormatError: a named step or path is damaged.
        ConfigError: ``best`` (not supported yet) or a malformed spec.
    """
    want = parse_spec(spec)
    if want == BEST:
        raise ConfigError("resume=best needs best-model retention, which is not supported yet")
    if want == LATEST:
        return _latest(run_dir)
    if isinstance(want, int):
        path = run_dir / step_dir_name(want)
        if not path.is_dir():
            have = [s for s, _ in scan(run_dir).committed]
            raise CheckpointNotFoundError(
                f"{path}: no checkpoint for step {want} in {run_dir}; "
                f"committed steps: {have or 'none'}",
                path=path,
            )
    else:
        path = Path(want)
    manifest, decoded = load(path)
    return Loaded(path=path, manifest=manifest, decoded=decoded)


def _latest(run_dir: Path) -> Loaded | None:
    skipped: list[tuple[Path, str]] = []
    for _step, path in reversed(scan(run_dir).committed):
        try:
            manifest, decoded = load(path)
        except (VerificationError, FormatError) as err:
            log.warning("RESUME FALLBACK: skipping %s, it failed verification: %s", path, err)
            skipped.append((path, str(err)))
            continue
        if skipped:
            log.warning("RESUME FALLBACK: resuming from %s instead of %s", path, skipped[0][0])
        return Loaded(path=path, manifest=manifest, decoded=decoded, skipped=skipped)
    if skipped:
        log.warning(
            "no checkpoint in %s verifies (%d damaged); starting fresh", run_dir, len(skipped)
        )
    else:
        log.warning("resume=latest: no checkpoint in %s yet; starting a fresh run", run_dir)
    return None
