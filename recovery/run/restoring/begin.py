"""The three ways a run begins: fresh, resumed, or warm-started from an artifact.

Each returns the run's :class:`Identity` (run id, lineage and links) after
loading what it must into the :class:`~recovery.state.registry.TrainState`; the
checkpointer adopts it and journals the event. Everything that can refuse
(purpose, drift in strict mode, state mismatch) is checked before the state is
touched.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from recovery.errors import (
    DriftError,
    FormatError,
    IncompatibleStateError,
    PurposeError,
)
from recovery.format import bounded
from recovery.format.layout import CONFIG_FILE, DISTRIBUTED, RANK_SNAPSHOT
from recovery.integrity.keys.signing import TrustStore
from recovery.parallel import loading, sharded
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.provenance import lineage, purpose
from recovery.provenance.drift import drift as drift_since
from recovery.run.restoring import checked, choose, history
from recovery.run.status import Identity
from recovery.state import declared
from recovery.state.registry import DROP_ENV, MODEL, TrainState, does_not_fit

log = logging.getLogger(__name__)


def new_run(
    state: TrainState,
    init_from: object | None,
    run_id: str,
    trust: TrustStore,
    allow_untrusted: bool,
    *,
    root: Path,
) -> tuple[Identity, dict[str, Any]]:
    """A new run (warm-started from ``init_from`` when given): its identity and journal event.

    Raises:
        as :func:`warm_start_from`.
    """
    if init_from is None:
        return fresh(run_id), {"event": "start", "run_id": run_id}
    ident = warm_start_from(
        state,
        Path(str(init_from)),
        run_id=run_id,
        trust=trust,
        allow_untrusted=allow_untrusted,
        root=root,
    )
    return ident, {"event": "warm_start", "run_id": ident.run_id, "from": str(init_from)}


def fresh(run_id: str) -> Identity:
    """A new run's identity: one ``start`` segment."""
    return Identity(run_id=run_id, lineage=[lineage.segment(lineage.START, run_id, 0, None)])


def resume_from(
    state: TrainState,
    loaded: choose.Loaded,
    *,
    run_id: str,
    provenance: dict[str, Any],
    config: dict[str, Any],
    strict: bool,
    root: Path,
    world: World = distributed.SINGLE,
    seed: int = 0,
) -> Identity:
    """Continue the run of ``loaded``: check drift, load every piece of state.

    A distributed checkpoint, or any resume inside a ``torchrun`` job, loads
    through :func:`recovery.parallel.loading.load_state` (resharding to ``world``;
    RNG streams reseeded from ``seed`` when the world size changed).

    Raises:
        DriftError: ``strict`` and code, dependencies, data or config changed.
        IncompatibleStateError: the checkpoint does not fit ``state``.
    """
    rec = loaded.manifest.recovery
    raw = loaded.files.get(CONFIG_FILE)
    old_config = _yaml(raw if isinstance(raw, bytes) else None, where=loaded.path / CONFIG_FILE)
    drift = drift_since(
        rec.get("provenance", {}), provenance, old_config=old_config, new_config=config
    )
    for line in drift:
        log.warning("DRIFT since %s: %s", loaded.path.name, line)
    if drift and strict:
        raise DriftError(
            f"{loaded.path}: refusing to resume (checkpoint.strict_resume=true); "
            f"{len(drift)} differences:\n  "
            + "\n  ".join(drift)
            + "\nRestore the original code, dependencies, data and config, "
            "or resume without strict mode.",
            differences=drift,
            path=loaded.path,
        )
    absent = {str(k): str(v) for k, v in (rec.get("absent") or {}).items()}
    resharded = None
    meta = loaded.decoded.meta
    if world.distributed or DISTRIBUTED in meta or RANK_SNAPSHOT in meta:
        if problems := state.absence_mismatches(absent, loaded.components):
            raise IncompatibleStateError(
                does_not_fit(loaded.path, problems),
                mismatches=problems,
                path=loaded.path,
            )
        resharded = loading.load_state(
            state, loaded.decoded, loaded.files, loaded.path, world=world, seed=seed
        )
        restored = [n for n in state.names if n in loaded.components and n != dropped()]
    else:
        restored = state.load_state_dict(
            loaded.decoded.tree, source=str(loaded.path), absent=absent
        )
    step = loaded.decoded.step
    rid = str(rec.get("run_id") or run_id)
    source = lineage.link(loaded.manifest, loaded.path, root)
    said = declared.describe(restored, absent)
    log.info("%s", announce(loaded, rid, step, said, each_rank=world.distributed))
    return Identity(
        run_id=rid,
        lineage=[
            *rec.get("lineage", []),
            lineage.segment(
                lineage.RESUME,
                rid,
                step,
                source,
                drift=drift,
                world_size=world.size,
                **({"resharded": resharded} if resharded else {}),
            ),
        ],
        step=step,
        previous=source,
        parent={"kind": lineage.RESUME, **source},
        drift=drift,
        resumed_from=loaded.path,
        resharded=resharded,
        old_config=old_config,
        restored=restored,
        absent=absent,
    )


def warm_start_from(
    state: TrainState,
    path: Path,
    *,
    run_id: str,
    trust: TrustStore,
    allow_untrusted: bool,
    root: Path,
) -> Identity:
    """A new run whose model weights come from the artifact at ``path``.

    Raises:
        VerificationError, FormatError: the artifact is damaged or untrusted.
        PurposeError: it is not a continuation or warm-start artifact, or holds no model.
        IncompatibleStateError: its weights do not fit the model.
    """
    loaded = choose.load(path, trust, allow_untrusted=allow_untrusted)
    purpose.check_use(
        purpose.INIT, loaded.manifest.purpose, where=str(path), present=loaded.components
    )
    sharded.refuse_plain_into_sharded(state.components.get(MODEL), path)
    tree = sharded.tree_with_model(
        loaded.decoded.tree, loaded.files, loaded.decoded.meta, where=path
    )
    if MODEL not in tree:
        raise PurposeError(f"{path}: holds no model weights to start from", missing=[MODEL])
    state.load_state_dict(tree, source=str(path), only=[MODEL])
    source = lineage.link(loaded.manifest, path, root)
    log.info("warm start: new run %s initialised from %s", run_id, path)
    return Identity(
        run_id=run_id,
        lineage=[
            *loaded.manifest.recovery.get("lineage", []),
            lineage.segment(lineage.WARM_START, run_id, 0, source),
        ],
        parent={"kind": lineage.WARM_START, **source},
    )


def dropped() -> str:
    """The component a drill asked a resume not to restore (``RECOVERY_DRILL_DROP``), or ''."""
    return os.environ.get(DROP_ENV, "")


def _yaml(data: bytes | None, *, where: Path) -> dict[str, Any] | None:
    """A verified ``config.yaml``'s mapping.

    Raises:
        FormatError: the verified bytes are not YAML, or nest too deep.
    """
    if data is None:
        return None
    try:
        doc = bounded.yaml_load(data)
    except ValueError as err:
        raise FormatError(f"{where}: expected the run's YAML config ({err})", path=where) from err
    return doc if isinstance(doc, dict) else None


def pick(
    run_dir: Path,
    spec: object,
    trust: TrustStore,
    *,
    allow_untrusted: bool,
    journal: Path,
    events_trust: TrustStore,
    strict: bool,
    defer: Callable[[str], bool] | None = None,
    exclude: Mapping[Path, str] | None = None,
    local: Sequence[tuple[int, Path]] | None = None,
    past: history.History | None = None,
) -> tuple[choose.Loaded | None, str | None, history.History]:
    """The checkpoint to resume (:func:`recovery.run.restoring.choose.select`, checked against the
    run's journal, whose steering events count when sealed by a key in ``events_trust``),
    the same on every rank. ``defer``, ``exclude``, ``local``: as ``select``'s.

    Under torchrun, when the ranks chose different steps and some took a ``local``
    snapshot (another rank's of that step did not verify), every rank passes its ``local``
    ones over (added to ``exclude``) and chooses again. ``past``: the journal's history,
    when this process read it already.

    Returns:
        The checkpoint (``None``: start fresh); the run id it replaces when ``spec``
        names another run's checkpoint explicitly (loaded knowingly, and recorded so);
        and the run's history as its journal tells it (read once, here).

    Raises:
        as :func:`recovery.run.restoring.choose.select`; RecoveryError: the ranks chose differently.
    """
    if past is None:  # not read already by this process's start (rank 0's is)
        past = history.read(journal, events_trust)
    excluded = dict(exclude or {})
    while True:
        loaded = choose.select(
            run_dir,
            spec,
            trust,
            allow_untrusted=allow_untrusted,
            history=past,
            strict=strict,
            defer=defer,
            exclude=excluded,
            local=local,
        )
        step = loaded.decoded.step if loaded is not None else -1
        if local is None or loading.same_step(step):
            break
        took = loaded is not None and loaded.path in {p for _, p in local}
        if not distributed.any_of(took)[0]:
            break  # not the local tier's doing: agree_on_resume says so
        which = f" of step {local[-1][0]}" if local else ""
        why = f"another rank could not resume its local snapshot{which}"
        log.warning("RESUME FALLBACK: passing over this rank's local snapshots: %s", why)
        excluded.update({p: why for _, p in local})
    loading.agree_on_resume(step, loaded.path if loaded else None, run_dir)
    replaced = None
    if loaded is not None and history.foreign(past, loaded.manifest.recovery.get("run_id")):
        replaced = past.run_id
        log.warning(
            "%s: is a checkpoint of run %s, not of this directory's run %s; continuing it "
            "as asked (recorded in the journal)",
            loaded.path,
            loaded.manifest.recovery.get("run_id"),
            replaced,
        )
    return loaded, replaced, past


def finished(step: int, final_step: int) -> str:
    """What a rerun of a finished run says: nothing to train, and what to change."""
    return (
        f"the run is finished: it resumed at step {step}, its final step ({final_step}); "
        "nothing to train. To train on, raise the final step (final_step=, or train.steps "
        "for train.py) and resume: a schedule that is a function of the final step (the "
        "recipes' cosine) is then recomputed for the new length, which the resume says; "
        "or start a new run from this checkpoint (+init_from=)"
    )


def announce(
    loaded: choose.Loaded, run_id: str, step: int, restored: str, *, each_rank: bool = False
) -> str:
    """The resume's line: which run, at which step, from which checkpoint of which tier,
    what was verified and who signed it, what was restored. ``each_rank``: a distributed
    load, where each rank verifies the signature and the files it reads."""
    tier = loaded.manifest.recovery.get("tier", "persistent")
    files = len(loaded.manifest.files) + sum(len(b.manifest.files) for b in loaded.links)
    digests = "the digests of the files each rank read" if each_rank else f"{files} file digests"
    return (
        f"RESUMED run {run_id[:12]} at step {step} from {loaded.path} ({tier} tier; "
        f"verified: signature and {digests}, signed by "
        f"{checked.signer_text(checked.signer(loaded.manifest))}): {restored}"
    )


def resume_event(
    loaded: choose.Loaded, ident: Identity, world_size: int, *, replaced: str | None = None
) -> dict[str, Any]:
    """The journal's ``resume`` record: the run id, from where, which newer checkpoints were
    passed over, what drifted, the world size (and its change), the run it replaced, the
    components restored and what the checkpoint declared absent (with the reasons)."""
    return {
        "event": "resume",
        "run_id": ident.run_id,
        **({"replaced_run": replaced} if replaced else {}),
        "from": str(loaded.path),
        "tier": loaded.manifest.recovery.get("tier", "persistent"),
        **({"base": str(loaded.base.path)} if loaded.base is not None else {}),
        "step": ident.step,
        "skipped": [str(p) for p, _ in loaded.skipped],
        "drift": ident.drift,
        "world_size": world_size,
        **({"resharded": ident.resharded} if ident.resharded else {}),
        "restored": ident.restored,
        "absent": ident.absent,
    }
