"""The checkpoint protocol across the ranks of a ``torchrun`` job: one consistent snapshot.

Save, at a step boundary every rank has reached (all ranks decide to save
together, see :meth:`~recovery.run.checkpointer.Checkpointer.maybe_save`):

1. rank 0 creates the temp directory and sends its name to the others;
2. every rank writes its own state (``ranks/rank-NNNNN.*``, fsynced);
3. the ranks agree that every one of them succeeded; if any failed, all
   stop and nothing is committed;
4. model and optimizer go through DCP into ``dcp/`` (collective: each rank
   writes the shards it holds), and each rank hashes what it wrote;
5. the ranks agree again and send rank 0 their digests; then rank 0 alone
   writes the replicated state (``state.json``, the other components,
   ``config.yaml``), hashes what no rank reported (DCP's ``.metadata``), signs
   the manifest of every file last and renames the directory into place,
   exactly as :func:`recovery.integrity.commit.commit` does for one process;
6. rank 0 tells the others whether the commit happened.

A rank that dies at any point (SIGKILL, OOM) breaks the next collective on
the others, so no rank reaches step 5's rename: the temp directory stays
behind, unsigned and ignored, and the next start removes it.

Load (:func:`load_state`): every rank verifies the whole checkpoint (DCP's
pickle metadata included) before DCP reads a byte of it; DCP reshards model
and optimizer onto the current world; the global data cursor needs no
resharding; per-rank RNG streams are restored exactly on the same world size
and reseeded from (seed, step, rank) on another, which is recorded as
``resharded``.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

from recovery import faults
from recovery.errors import CommitError, ConfigError, IncompatibleStateError, RecoveryError
from recovery.format import tensorfile
from recovery.format.layout import DCP_DIR, DISTRIBUTED, temp_dir_for
from recovery.format.manifest import FileRecord
from recovery.parallel import sharded
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.state import rng
from recovery.state.registry import MODEL, OPTIMIZER, RNG, TrainState
from recovery.state.snapshot import Decoded

log = logging.getLogger(__name__)


def describe(world: World, strategy: str, groups: dict[str, Any]) -> dict[str, Any]:
    """The ``state.json`` record of a distributed checkpoint."""
    return {
        "world_size": world.size,
        "strategy": strategy,
        "sharded": list(sharded.SHARDED),
        "per_rank": list(sharded.PER_RANK),
        "dcp": DCP_DIR,
        OPTIMIZER: groups,
    }


def write_parts(
    state: TrainState, final: Path, world: World, step: int
) -> tuple[Path, dict[str, Any], list[FileRecord]]:
    """Steps 1-5 up to rank 0's commit: every rank's files and the DCP shards, agreed.

    Returns:
        The temp directory (complete on every rank's side), the optimizer's
        param groups for ``state.json``, and the records (name, sha256, size)
        of the files the ranks wrote, each hashed by its writer.

    Raises:
        CommitError: this or another rank failed; nothing was committed.
    """
    name = distributed.broadcast_text(temp_dir_for(final).name if world.leader else "")
    tmp = final.with_name(name)
    if world.leader:
        tmp.mkdir()
    distributed.barrier()
    failure: BaseException | None = None
    own: list[FileRecord] = []
    try:
        own = sharded.write_rank(tmp, world.rank, {RNG: rng.capture()})
        faults.reach(f"rank-{world.rank}-write-{step}")
    except (OSError, RecoveryError) as err:
        failure = err
    _agree(failure, "write its state", tmp=tmp, world=world, final=final, step=step)
    model, optimizer = state.components[MODEL], state.components[OPTIMIZER]
    try:
        groups = sharded.save(model, optimizer, tmp / DCP_DIR)
    except BaseException as err:  # DCP's wrapper of the ranks' failures is a BaseException
        if not sharded.dcp_failure(err):
            raise
        _abandon(tmp, world)
        raise CommitError(
            f"step {step}: the sharded save failed ({sharded.failure(err)}); "
            "nothing was committed and earlier checkpoints are intact.",
            path=final,
        ) from err
    faults.reach(f"rank-{world.rank}-sharded-{step}")
    # each rank hashes what it wrote, in parallel, and sends rank 0 the digests: rank 0
    # reading every rank's shards back would be the whole checkpoint's size in reads on one node
    records: list[FileRecord] = []
    try:
        records = [*own, *_hash_shards(tmp, world.rank)]
    except OSError as err:
        failure = err
    _agree(failure, "hash its shards", tmp=tmp, world=world, final=final, step=step)
    gathered = distributed.gather_text(json.dumps([[r.name, r.digest, r.size] for r in records]))
    every = [
        FileRecord(str(n), str(h), int(s)) for text in gathered for n, h, s in json.loads(text)
    ]
    return tmp, groups, every


def _agree(
    failure: BaseException | None, doing: str, *, tmp: Path, world: World, final: Path, step: int
) -> None:
    """Continue only if every rank succeeded; otherwise abandon the save on all of them."""
    if distributed.all_ok(failure is None):
        return
    _abandon(tmp, world)
    raise CommitError(
        f"step {step}: a rank could not {doing}"
        + (f" (this rank: {failure})" if failure else "")
        + "; nothing was committed and earlier checkpoints are intact.",
        path=final,
    ) from failure


def _hash_shards(tmp: Path, rank: int) -> list[FileRecord]:
    """The DCP files this rank wrote (``__<rank>_<n>.distcp``), hashed."""
    out = []
    for path in sorted((tmp / DCP_DIR).glob(f"__{rank}_*")):
        digest, size = tensorfile.hash_file(path)
        out.append(FileRecord(path.relative_to(tmp).as_posix(), digest, size))
    return out


def adopted(tmp: Path, hashed: list[FileRecord]) -> list[str | FileRecord]:
    """Every file in ``tmp``: the records the ranks sent, and the names of the rest
    (DCP's ``.metadata``, written by rank 0's DCP coordinator), which rank 0 hashes.

    Raises:
        CommitError: a rank reported a file that is not there.
    """
    present = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    missing = sorted({r.name for r in hashed} - set(present))
    if missing:
        raise CommitError(f"{tmp}: ranks reported {missing}, which are not there", path=tmp)
    known = {r.name for r in hashed}
    return [*hashed, *(name for name in present if name not in known)]


def announce(world: World, committed: bool, final: Path, step: int) -> None:
    """Step 6: rank 0 tells every rank whether it committed; the others raise if not."""
    if distributed.broadcast_int(int(committed)) == 0 and not world.leader:
        raise CommitError(
            f"step {step}: rank 0 could not commit {final}; nothing was committed.", path=final
        )


def _abandon(tmp: Path, world: World) -> None:
    if world.leader:
        shutil.rmtree(tmp, ignore_errors=True)


def agree_on_resume(step: int, chosen: Path | None, run_dir: Path) -> None:
    """Every rank chose the same checkpoint (``step``, -1 for none) to resume from.

    Raises:
        RecoveryError: they did not (a checkpoint root that is not one shared filesystem).
    """
    if not distributed.all_ok(step == distributed.broadcast_int(step)):
        raise RecoveryError(
            f"{run_dir}: the ranks chose different checkpoints to resume from "
            f"(this rank: {chosen or 'none'}); is the checkpoint root "
            "one shared filesystem for every node?",
            path=run_dir,
        )


def load_state(
    state: TrainState,
    decoded: Decoded,
    files: dict[str, Any],
    path: Path,
    *,
    world: World,
    seed: int,
) -> dict[str, Any] | None:
    """Restore ``state`` on the current world from a verified checkpoint: its decoded
    tree, its verified files and its path.

    Model and optimizer come from DCP when the checkpoint has them there (at
    any world size, with or without a process group), otherwise from their
    files (a single-process checkpoint resumed by a ``torchrun`` job with
    replicated state). Everything that can refuse is checked before anything
    is applied.

    Returns:
        ``{"from": old, "to": new, "rng": ...}`` when the world size changed
        (the RNG streams were reseeded), else ``None``.

    Raises:
        IncompatibleStateError, FormatError: nothing was changed.
    """
    tree = decoded.tree
    spread = decoded.meta.get(DISTRIBUTED)
    saved_size = int(spread["world_size"]) if isinstance(spread, dict) else 1
    via_dcp = isinstance(spread, dict)
    if not via_dcp:
        sharded.refuse_plain_into_sharded(state.components.get(MODEL), path)
    plain = [n for n in state.components if not (via_dcp and n in sharded.SHARDED)]
    problems = state.mismatches(tree, only=plain)
    own: dict[str, Any] | None = None
    if saved_size == world.size:  # the same ranks: each continues its own RNG streams exactly
        own = sharded.read_rank(files, world.rank, where=path) if via_dcp else {RNG: tree[RNG]}
        problems += [f"rank {world.rank} {line}" for line in rng.validate(own.get(RNG))]
    if problems:
        raise IncompatibleStateError(
            f"{path} does not fit this run ({len(problems)} mismatches):\n  "
            + "\n  ".join(problems),
            mismatches=problems,
            path=path,
        )
    if isinstance(spread, dict):
        sharded.load(
            state.components[MODEL],
            state.components[OPTIMIZER],
            files,
            spread.get(OPTIMIZER, {}),
            where=path,
        )
    state.load_state_dict(tree, source=str(path), only=plain)
    step = decoded.step
    if own is not None:
        rng.restore(own[RNG])
        return None
    derived = distributed.reseed(seed, step, world.rank)
    log.warning(
        "resharded: %s was saved by %d rank(s), resumed on %d; model and optimizer resharded, "
        "data cursor kept, RNG streams reseeded from (seed %d, step %d, rank %d) -> %d",
        path,
        saved_size,
        world.size,
        seed,
        step,
        world.rank,
        derived,
    )
    return {"from": saved_size, "to": world.size, "rng": "reseeded from (seed, step, rank)"}


def check_supported(
    world: World, *, async_save: bool, warm_start_every: int, hash_type: str = "sha256"
) -> None:
    """Refuse the options the distributed protocol does not implement yet, by name."""
    if not world.distributed:
        return
    if hash_type != "sha256":
        raise ConfigError(
            f"checkpoint.hash={hash_type} is not supported under torchrun yet (each rank "
            "hashes its DCP shards with sha256); set checkpoint.hash=sha256"
        )
    if async_save:
        raise ConfigError(
            "checkpoint.async=true is not supported under torchrun yet; "
            "set checkpoint.async=false (saves are synchronous on every rank)"
        )
    if warm_start_every:
        raise ConfigError(
            "checkpoint.warm_start_every is not supported under torchrun yet; "
            "export or warm-start from a continuation checkpoint instead"
        )
