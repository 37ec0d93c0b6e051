"""Async saves and preemption signals on real processes: recovery stays bit-identical."""

from __future__ import annotations

import signal

import pytest

from recovery import cli
from recovery.format.layout import scan, step_dir_name
from recovery.run.journal import read
from recovery.run.scheduling.preemption import SAME_REQUEST_S
from tests.integration.conftest import assert_same_run

pytestmark = pytest.mark.integration


def trusted(signer):
    return ["--trusted", str(signer.path.parent)]


def test_sigkill_during_a_background_write_falls_back_bit_identical(
    tmp_path, trainer, reference, trust, signer
):
    first = trainer(tmp_path, "checkpoint.async=true", pause_at="commit-write-40")
    assert first.returncode == -9
    listing = scan(first.run_dir)
    assert [s for s, _ in listing.committed] == [10, 20, 30]
    assert [p.name.split(".")[0] for p in listing.stale] == [step_dir_name(40)]
    second = trainer(tmp_path, "checkpoint.async=true", "+resume=latest")
    assert second.returncode == 0, second.output
    events = read(second.run_dir / "metrics.jsonl")
    assert [r["step"] for r in events if r.get("event") == "resume"] == [30]
    costs = [r for r in events if r.get("event") == "checkpoint"]
    assert costs and all(r["mode"] == "async" and r["pause_s"] < r["write_s"] for r in costs)
    assert_same_run(reference, second.run_dir, trust)


def test_sigterm_checkpoints_at_the_next_step_and_exits_the_configured_code(
    tmp_path, trainer, reference, trust, signer
):
    # 143, as a Kubeflow PyTorchJob needs (restartPolicy ExitCode retries 128-255 only);
    # the default 75 is exited by the own loop (test_own_loop_exits) and torchrun's ranks
    # (test_distributed_async)
    job = ("checkpoint.async=true", "checkpoint.preempt_exit_code=143")
    first = trainer(tmp_path, *job, pause_at="step-45", signals=(signal.SIGTERM,))
    assert first.returncode == 143, first.output
    assert "preempted: SIGTERM: checkpointed step 46" in first.output
    assert "second preemption signal" not in first.output  # 143 by choice, not 128+SIGTERM
    assert [s for s, _ in scan(first.run_dir).committed] == [30, 40, 46]  # keep_last=3
    assert cli.main(["verify", str(first.run_dir / step_dir_name(46)), *trusted(signer)]) == 0
    second = trainer(tmp_path, *job, "+resume=latest")
    assert second.returncode == 0, second.output
    resumes = [r for r in read(second.run_dir / "metrics.jsonl") if r.get("event") == "resume"]
    assert resumes[-1]["step"] == 46
    assert_same_run(reference, second.run_dir, trust)


def test_second_signal_exits_at_once_and_damages_nothing(
    tmp_path, trainer, reference, trust, signer
):
    # past the window in which a second signal is the same request (SLURM's own plus a copy)
    gap = SAME_REQUEST_S + 0.5
    sigs = (signal.SIGTERM, signal.SIGUSR1)
    first = trainer(tmp_path, pause_at="step-45", signals=sigs, signal_gap=gap)
    assert first.returncode == 128 + signal.SIGUSR1, first.output
    assert "second preemption signal" in first.output
    committed = scan(first.run_dir).committed
    assert [s for s, _ in committed] == [20, 30, 40]
    for _, path in committed:
        assert cli.main(["verify", str(path), *trusted(signer)]) == 0
    second = trainer(tmp_path, "+resume=latest")
    assert second.returncode == 0, second.output
    assert_same_run(reference, second.run_dir, trust)
