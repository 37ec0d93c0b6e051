"""Choose, verify and decode the checkpoint a run resumes from; the verifying loader.

``+resume=`` takes ``latest``, a step number, or a path to a checkpoint
directory. ``latest`` walks committed checkpoints newest first and takes the
first that verifies and decodes, warning loudly (file, expected, found) about
each one it passes over; with none at all it returns ``None`` and the run
starts fresh, so the same command line is safe to requeue. A named step or
path must verify, or the resume fails: the user asked for that one.

:func:`load` is the one verifying loader every reader of tensors goes through:
signature and trust, then every file's size and digest, then decoding of the
verified bytes, then the artifact's own purpose contract.
:func:`recovery.run.restoring.checked.check` verifies the same, decoding no tensor (the
structure from ``state.json`` and the tensor files' headers): what ``recovery ls``
and ``recovery verify`` show, without torch.
This module imports torch only when :func:`load` runs.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recovery.errors import (
    CheckpointNotFoundError,
    ConfigError,
    ForeignCheckpointError,
    FormatError,
    PurposeError,
    RollbackError,
    TrackingError,
    VerificationError,
)
from recovery.format.layout import BEST_DIR, scan, step_dir_name
from recovery.format.manifest import Manifest
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import chain
from recovery.provenance import purpose
from recovery.run.restoring import checked, history
from recovery.run.restoring.history import History
from recovery.run.tiers import rules
from recovery.storage import tracking

if TYPE_CHECKING:  # the decoding reader and decoder import torch: load() imports them
    import torch

    from recovery.integrity.reads import reader
    from recovery.state.snapshot import Decoded

log = logging.getLogger(__name__)

LATEST = "latest"
BEST = "best"


@dataclass(frozen=True)
class Loaded:
    """A verified, decoded artifact."""

    path: Path
    manifest: Manifest
    decoded: Decoded
    components: list[str]
    """The purpose-contract components it holds."""
    files: dict[str, bytes | torch.Tensor | reader.Deferred] = field(
        repr=False, default_factory=dict
    )
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    """Newer checkpoints passed over (``latest`` only), with the reason for each."""
    links: list[reader.Verified] = field(repr=False, default_factory=list)
    """A delta's verified chain of bases, the full checkpoint first (empty: a full one)."""

    @property
    def base(self) -> reader.Verified | None:
        """A delta's own verified base (``None``: a full checkpoint)."""
        return self.links[-1] if self.links else None

    @property
    def delta(self) -> dict[str, Any] | None:
        """What a delta is (:func:`.checked.delta_of`; ``None``: a full checkpoint)."""
        return checked.delta_of(self.decoded.meta, self.manifest, self.links)

    @property
    def verified(self) -> reader.Verified:
        """Its own verified files (a delta's, without the base's)."""
        from recovery.integrity.reads import reader  # torch, as load() that made this

        return reader.Verified(self.path, self.manifest, self.files)


def parse_spec(spec: object, key: str = "+resume") -> str | int | Path:
    """Normalise a ``+resume=`` value: ``"latest"``, ``"best"``, a step (int) or a path.

    ``key`` is the config key the value came from (``export.source``), for the messages.

    A bare word (no ``/``, not starting with ``.`` or ``~``) is a path only if something by
    that name exists in the working directory: otherwise it is a typo, not a checkpoint to
    look for.

    Raises:
        ConfigError: an empty or negative value, or a bare word that is neither ``latest``,
            ``best``, a step number nor an existing path (with "did you mean" when close).
    """
    name = key.lstrip("+")
    if isinstance(spec, bool) or spec is None:
        raise ConfigError(f"{name}: expected latest, a step number or a path, got {spec!r}")
    if isinstance(spec, int):
        if spec < 0:
            raise ConfigError(f"{name}: step must be >= 0, got {spec}")
        return spec
    text = str(spec).strip()
    if not text:
        raise ConfigError(f"{name}: expected latest, a step number or a path, got an empty value")
    if text in (LATEST, BEST):
        return text
    if text.isdigit():
        return int(text)
    bare = "/" not in text and os.sep not in text and not text.startswith((".", "~"))
    if bare and not os.path.lexists(text):
        raise ConfigError(
            f"{name}: {text!r} is neither latest, a step number nor an existing path (nothing "
            f"named so in {os.getcwd()}){_did_you_mean(text, key)} Use {key}=latest, "
            f"{key}=<step> or {key}=<checkpoint directory>."
        )
    return Path(text)


def _did_you_mean(word: str, key: str = "+resume") -> str:
    """The message's "; did you mean ...?" for a word close to ``latest``, ``best`` or a step
    directory's name (``step-N``: the step), else its full stop."""
    named = re.fullmatch(r"step-(\d+)", word)
    if named:
        return f"; did you mean {key}={int(named.group(1))}?"
    close = difflib.get_close_matches(word.lower(), [LATEST, BEST], n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else "."


def load(
    path: Path,
    trust: TrustStore,
    *,
    allow_untrusted: bool = False,
    defer: Callable[[str], bool] | None = None,
) -> Loaded:
    """Verify signature, trust and every byte of ``path`` (of a delta, and of its base,
    fetched from DVC when only tracked there), decode them, check its contract.

    ``defer``: files verified only when read
    (:func:`recovery.integrity.reads.reader.read_verified`).

    Raises:
        VerificationError (and subclasses; BrokenChainError: a delta's base is missing,
        damaged or replaced), FormatError, PurposeError.
    """
    from recovery.integrity.reads import reader  # torch: only a caller that decodes pays it
    from recovery.state import snapshot

    verified = reader.read_verified(path, trust, allow_untrusted=allow_untrusted, defer=defer)
    links = chain.read_chain(
        path,
        verified.manifest,
        lambda p: reader.read_verified(p, trust, allow_untrusted=allow_untrusted),
        fetch=checked.fetch_base,
    )
    decoded = snapshot.decode(verified, links)
    have = checked.contract(path, verified.manifest, decoded.tree, decoded.meta, verified.files)
    return Loaded(path, verified.manifest, decoded, have, files=verified.files, links=links)


def select(
    run_dir: Path,
    spec: object,
    trust: TrustStore,
    *,
    allow_untrusted: bool = False,
    history: History | None = None,
    strict: bool = False,
    key: str = "+resume",
    defer: Callable[[str], bool] | None = None,
    exclude: Mapping[Path, str] | None = None,
    local: Sequence[tuple[int, Path]] | None = None,
) -> Loaded | None:
    """The checkpoint ``spec`` names in ``run_dir``, verified and decoded.

    ``defer`` names files verified only when read (see :func:`load`); ``exclude``
    (``latest`` only): checkpoints already found damaged by such a read, with why;
    ``local`` (``latest`` only): the local tier's snapshots, ``(step, path)``, candidates
    too (:func:`recovery.run.tiers.rules.order`: newest step first, local first).

    With ``latest``, the run's own ``history`` (its journal) is checked too: a
    checkpoint another run wrote is passed over (``SUBSTITUTION``), and
    resuming older than the newest step the run committed and did not retire
    is said loudly (``ROLLBACK``). ``strict`` refuses both instead.

    Returns:
        The loaded checkpoint, or ``None`` when ``spec`` is ``latest`` and no
        checkpoint of the run verifies (the caller starts fresh).

    Raises:
        CheckpointNotFoundError: a named step or path does not exist.
        VerificationError, FormatError, PurposeError: a named step or path is
            damaged, untrusted, or not a continuation checkpoint.
        ForeignCheckpointError: ``latest`` found only another run's checkpoints
            (or one at all, when ``strict``).
        RollbackError: ``strict``, and ``latest`` would roll the run back.
        ConfigError: a malformed spec (named as ``key``, the config key it came from).
    """
    want = parse_spec(spec, key)
    if want == BEST:
        # committed ones only (never an interrupted copy's temp dir); the newest is the best
        kept = [p for _, p in scan(run_dir / BEST_DIR).committed]
        if not kept:
            raise CheckpointNotFoundError(
                f"{run_dir / BEST_DIR}: no best checkpoint; train with checkpoint.keep_best=true "
                f"(ranked by checkpoint.best_metric)",
                path=run_dir / BEST_DIR,
            )
        want = kept[-1]
    if want == LATEST:
        return _latest(
            run_dir,
            trust,
            allow_untrusted,
            history or History(),
            strict,
            defer,
            exclude or {},
            local,
            fresh=key == "+resume",
        )
    if isinstance(want, int):
        path = run_dir / step_dir_name(want)
        if not path.is_dir() and tracking.dvc_file(path).exists():
            tracking.materialize(path)
        if not path.is_dir():
            have = [s for s, _ in scan(run_dir).committed]
            raise CheckpointNotFoundError(
                f"{path}: no checkpoint for step {want} in {run_dir}; "
                f"committed steps: {have or 'none'}",
                path=path,
            )
    else:
        path = Path(want)
    loaded = load(path, trust, allow_untrusted=allow_untrusted, defer=defer)
    purpose.check_use(
        purpose.RESUME, loaded.manifest.purpose, where=str(path), present=loaded.components
    )
    return loaded


def candidates(run_dir: Path) -> list[tuple[int, Path]]:
    """Committed checkpoints on disk and those only tracked by DVC (step-N.dvc), oldest first."""
    found = dict(scan(run_dir).committed)
    for step, path in tracking.tracked_steps(run_dir).items():
        found.setdefault(step, path)
    return sorted(found.items())


def _latest(
    run_dir: Path,
    trust: TrustStore,
    allow_untrusted: bool,
    past: History,
    strict: bool,
    defer: Callable[[str], bool] | None,
    exclude: Mapping[Path, str],
    local: Sequence[tuple[int, Path]] | None = None,
    *,
    fresh: bool = True,
) -> Loaded | None:
    # fresh: the caller starts a fresh run when nothing verifies (a resume); else it refuses
    skipped: list[tuple[Path, str]] = []
    foreign: list[ForeignCheckpointError] = []
    for candidate in rules.order(candidates(run_dir), local or []):
        path = candidate.path
        if path in exclude:
            skipped.append((path, exclude[path]))
            continue
        try:
            if not path.exists():
                log.info("%s is not on disk; fetching it from DVC", path)
                tracking.materialize(path)
            loaded = load(path, trust, allow_untrusted=allow_untrusted, defer=defer)
            purpose.check_use(
                purpose.RESUME, loaded.manifest.purpose, where=str(path), present=loaded.components
            )
        except (VerificationError, FormatError, PurposeError, TrackingError) as err:
            log.warning("RESUME FALLBACK: skipping %s, it failed verification: %s", path, err)
            skipped.append((path, str(err)))
            continue
        if candidate.tier != rules.LOCAL and loaded.manifest.recovery.get("tier") == rules.LOCAL:
            why = rules.not_durable(path)
            log.warning("RESUME FALLBACK: skipping %s", why)
            skipped.append((path, why))
            continue
        if candidate.tier == rules.LOCAL and past.run_id != loaded.manifest.recovery.get(
            "run_id"
        ):  # RAM outlives a run directory deleted and started anew at the same path
            why = stale(path, loaded, run_dir)
            log.warning("RESUME FALLBACK: skipping %s", why)
            skipped.append((path, why))
            continue
        if history.foreign(past, loaded.manifest.recovery.get("run_id")):
            refused = _foreign(path, loaded, past)
            if strict:
                raise refused
            log.warning("SUBSTITUTION: skipping %s", refused)
            skipped.append((path, str(refused)))
            foreign.append(refused)
            continue
        _rollback(past, loaded.decoded.step, strict, path=run_dir)
        if skipped:
            log.warning("RESUME FALLBACK: resuming from %s instead of %s", path, skipped[0][0])
        return dataclasses.replace(loaded, skipped=skipped)
    if foreign:
        raise ForeignCheckpointError(
            f"{run_dir}: holds no checkpoint of this run ({past.run_id}) that verifies, and "
            f"{len(foreign)} of another run ({foreign[0].run_id}); refusing to start fresh "
            "over them. Move them out if they do not belong here, or pass their path as "
            "+resume=<path> to continue that run knowingly.",
            run_id=foreign[0].run_id,
            expected=foreign[0].expected,
            path=run_dir,
        )
    _rollback(past, 0, strict, path=run_dir)
    if skipped:
        log.warning(
            "no checkpoint in %s verifies (%d damaged)%s",
            run_dir,
            len(skipped),
            "; starting fresh" if fresh else "",
        )
    elif fresh:
        log.warning("resume=latest: no checkpoint in %s yet; starting a fresh run", run_dir)
    return None


def stale(path: Path, loaded: Loaded, run_dir: Path) -> str:
    """Why a local-tier snapshot is not resumed: the run directory's journal does not name
    its run (the directory was deleted, or holds another run now)."""
    theirs = str(loaded.manifest.recovery.get("run_id"))
    return (
        f"{path}: a stale local-tier snapshot of run {theirs[:12]}, which the journal of "
        f"{run_dir} does not name (the run directory was deleted or started anew); the "
        f"tier's directory {path.parent} is not resumed from"
    )


def _foreign(path: Path, loaded: Loaded, past: History) -> ForeignCheckpointError:
    theirs = str(loaded.manifest.recovery.get("run_id"))
    return ForeignCheckpointError(
        f"{path}: was written by run {theirs}, but this run directory's journal belongs to run "
        f"{past.run_id}; another run's checkpoint was put here. Move it out, or pass its "
        "path as +resume=<path> to continue that run knowingly.",
        run_id=theirs,
        expected=str(past.run_id),
        path=path,
    )


def _rollback(past: History, step: int, strict: bool, *, path: Path) -> None:
    why = history.rollback(past, step)
    if why is None:
        return
    if strict:
        raise RollbackError(
            f"{path}: refusing to resume (checkpoint.strict_resume=true): {why}. Restore that "
            "checkpoint (from the DVC remote: dvc pull), or resume without strict mode.",
            differences=[why],
            path=path,
        )
    log.warning("ROLLBACK: %s; resuming from step %d loses what came after it", why, step)
