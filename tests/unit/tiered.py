"""A checkpointer with a local tier, and a crashed run of it, for the tiers' unit tests."""

from recovery.config import CheckpointConfig, LocalConfig
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal
from tests.conftest import tiny_state, train_steps


def checkpointer(tmp_path, signer, trust, prov, *, final=8, async_save=False) -> Checkpointer:
    local = LocalConfig(every_steps=2, root=str(tmp_path / "shm"))
    cfg = CheckpointConfig(
        root=str(tmp_path), every_steps=6, keep_last=2, local=local, async_save=async_save
    )
    return Checkpointer(
        cfg,
        tmp_path / "run",
        final_step=final,
        journal=Journal(tmp_path / "run" / "metrics.jsonl"),
        signer=signer,
        trust=trust,
        provenance=prov,
        config={"seed": 0},
    )


def crash_at(
    tmp_path, signer, trust, prov, steps: int, *, async_save: bool = False
) -> tuple[Checkpointer, list]:
    """Train ``steps`` of a 12-step run and stop there, the process left as a crash leaves
    it, but for the lock (closed): local snapshots up to ``steps``, persistent 6."""
    state = tiny_state()
    ck = checkpointer(tmp_path, signer, trust, prov, final=12, async_save=async_save)
    start = ck.restore(state, "latest")
    for step in range(start + 1, steps + 1):
        train_steps(state, 1)
        if step == steps:  # step 6's promotion done: the last snapshot retires its copy
            ck.flush()
        ck.maybe_save(state, step)
    ck.close()  # the newest step (local) is newer than the newest persistent: kept
    return ck, [t.clone() for t in state.components["model"].parameters()]
