"""Two real gloo ranks under one SLURM job, only rank 1 signalled by the time limit's
SIGUSR1: both stop on it at the same step, rank 0 journals the time limit and requeues
the job (``scontrol`` on PATH is a script that records its arguments), and rank 0's own
copy of the signal, arriving after it closed, does not end it."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp

from recovery.config import CheckpointConfig, ClusterConfig
from recovery.errors import Preempted
from recovery.integrity.keys.signing import Signer, TrustStore
from recovery.parallel import world as distributed
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import read
from recovery.run.scheduling.preemption import PreemptionGuard
from tests.conftest import tiny_state, train_steps

SCONTROL = '#!/bin/sh\necho "$@" >> "$(dirname "$0")/calls"\n'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, root: str, key: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        SLURM_JOB_ID="88",
        PATH=f"{root}/bin:{os.environ['PATH']}",
    )
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    signer = Signer(Path(key))
    trust = TrustStore()
    trust.add_pem(signer.public_pem, source="test key")
    cfg = CheckpointConfig(root=root, every_steps=10, cluster=ClusterConfig(requeue="time_limit"))
    ck = Checkpointer(
        cfg,
        Path(root) / "run",
        final_step=10,
        signer=signer,
        trust=trust,
        provenance={"note": "test"},
        config={"seed": 0},
        health=False,
        world=distributed.current(),
        # the window from this rank's agreed stop past its close, however loaded the machine
        preemption=PreemptionGuard(cfg.preempt_signals, window_s=120).install(),
    )
    state = tiny_state()
    ck.restore(state, None)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGUSR1)  # rank 0's copy is late
    train_steps(state, 1)
    try:
        ck.maybe_save(state, 1)
        raise AssertionError("not preempted")
    except Preempted as stop:
        err = stop
    ck.close()
    assert ck.preemption is not None
    ck.preemption.uninstall()  # what close() does with a guard it made
    if rank == 0:
        os.kill(os.getpid(), signal.SIGUSR1)  # its own copy, after the close
    requeued = ck.requeue_after(err)
    Path(root, f"rank{rank}.json").write_text(json.dumps([err.signal_name, err.step, requeued]))
    torch.distributed.destroy_process_group()


def test_only_rank_1_signalled_by_the_time_limit_still_requeues_it(tmp_path, signer):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scontrol").write_text(SCONTROL)
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    # forked: the ranks need not import torch again (no process group in this one)
    mp.start_processes(
        _rank, args=(_free_port(), str(tmp_path), str(signer.path)), nprocs=2, start_method="fork"
    )
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert seen == [["SIGUSR1", 1, True], ["SIGUSR1", 1, False]]
    assert (tmp_path / "bin" / "calls").read_text() == "update JobId=88 Requeue=1\nrequeue 88\n"
    stops = [r for r in read(tmp_path / "run" / "metrics.jsonl") if r.get("event") == "preempted"]
    assert [(r["signal"], r["step"]) for r in stops] == [("SIGUSR1", 1)]
