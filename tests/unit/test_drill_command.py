"""`recovery drill -- CMD`: what it refuses, how a failing or hanging command is reported,
and which kill points it draws from a watched run (a model of the run reaches each)."""

import json
import random
import sys
import time

import psutil
import pytest

from recovery import cli
from recovery.cli.commands.drill import command_of
from recovery.errors import ConfigError
from recovery.tools import killpoints
from recovery.tools.drill import command as drill_command
from recovery.tools.drill.verdict import Level, compare_steps
from tests.unit.test_drill import reached

PY = sys.executable


def drill(tmp_path, *command: str, flags: tuple[str, ...] = ()) -> list[str]:
    return ["drill", "--out", str(tmp_path / "drill"), *flags, "--", *command]


def test_a_command_is_told_from_hydra_overrides():
    assert command_of(["train.steps=5", "+resume=latest", "~health"]) is None
    assert command_of([]) is None
    assert command_of(["python", "x.py"]) == ["python", "x.py"]  # refused below: no {run_dir}
    assert command_of(["a=1", "{run_dir}"]) == ["a=1", "{run_dir}"]


@pytest.mark.parametrize(
    ("command", "flags", "says"),
    [
        ((PY, "x.py", "--run-dir", "runs/a"), (), "has no {run_dir} argument"),
        ((PY, "x.py", "{run_dir}"), ("--dvc",), "drill --dvc: only for the project's train.py"),
        ((PY, "x.py", "{run_dir}"), ("--script", "t.py"), "drill --script: only for"),
    ],
)
def test_a_command_the_drill_cannot_run_is_a_one_line_usage_error(
    tmp_path, capsys, command, flags, says
):
    assert cli.main(drill(tmp_path, *command, flags=flags)) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    assert not (tmp_path / "drill").exists()


def test_a_command_that_fails_by_itself_is_reported_with_its_stderr_not_as_a_difference(
    tmp_path, capsys
):
    script = "import sys; print('progress', flush=True); sys.exit('loss is nan, giving up')"
    assert cli.main(drill(tmp_path, PY, "-c", script, "{run_dir}")) == 1
    err = capsys.readouterr().err
    assert "the reference run of" in err and "(exit 1; the drill did not kill this run" in err
    assert err.split("its stderr ends:")[1] == "\n  loss is nan, giving up\n"  # no stdout
    assert "drill failed" not in err and not (tmp_path / "drill" / "drill.json").exists()


def test_a_hanging_command_is_killed_at_the_timeout_with_everything_it_started(tmp_path, capsys):
    # the command starts a child of its own: the timeout must take both down
    script = (
        "import os, subprocess, sys, time, pathlib; d = pathlib.Path(sys.argv[1]); "
        "d.mkdir(parents=True); c = subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); (d / 'pids').write_text(f'{os.getpid()} {c.pid}'); "
        "time.sleep(60)"
    )
    started = time.monotonic()
    code = cli.main(drill(tmp_path, PY, "-c", script, "{run_dir}", flags=("--timeout", "2s")))
    assert code == 1 and time.monotonic() - started < 30
    assert "did not finish within 2s and was killed" in capsys.readouterr().err
    pids = [int(p) for p in (tmp_path / "drill/reference/run/pids").read_text().split()]
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)


def alive(pid: int) -> bool:
    """Running (a killed child that nobody has reaped yet is a zombie: not running)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_command_that_writes_no_per_step_record_is_a_config_error(tmp_path, capsys):
    script = "import pathlib, sys; pathlib.Path(sys.argv[1]).mkdir(parents=True)"
    assert cli.main(drill(tmp_path, PY, "-c", script, "{run_dir}")) == 12
    assert "wrote no per-step record" in capsys.readouterr().err


def journal(run_dir, records):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_watch_reads_commits_and_retirements_and_refuses_a_clock_cadence(tmp_path):
    steps = [{"step": s, "loss": 1.0} for s in range(1, 13)]
    events = [
        {"event": "checkpoint", "step": 4},
        {"event": "checkpoint", "step": 8},
        {"event": "retired", "steps": [4]},
        {"event": "checkpoint", "step": 12},
    ]
    journal(tmp_path / "a", steps + events)
    (tmp_path / "a" / "step-00000012").mkdir()
    seen = drill_command.watch(tmp_path / "a")
    assert (seen.steps, seen.commits, seen.retires) == (12, [4, 8, 12], [(4, 12)])
    clock = {"event": "run_summary", "interval": {"mode": "fixed", "every_seconds": 60.0}}
    journal(tmp_path / "b", [*steps, *events, clock])
    with pytest.raises(ConfigError, match="checkpoints on a clock"):
        drill_command.watch(tmp_path / "b")
    journal(tmp_path / "c", steps + events)
    with pytest.raises(ConfigError, match="last step 12 has no checkpoint"):
        drill_command.watch(tmp_path / "c")


CONFIGS = [(12, 4, 2), (80, 10, 3), (33, 4, 4), (20, 10, 2)]  # steps, every, keep_last


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", range(6))
def test_a_watched_runs_points_are_steps_commit_phases_and_a_retirement_each_reached(config, seed):
    steps, every, keep_last = config
    commits = killpoints.commit_steps(steps, every)
    doomed, _ = killpoints.retention(commits, keep_last=keep_last, keep_every=0)
    retires = [(n, c) for c in commits for n in doomed[c]]
    room = killpoints.observed_room(steps, commits, retires)
    rng = random.Random(seed)
    for kills in sorted({0, 3, 5, room.capacity}):
        points = killpoints.choose_observed(
            rng, steps=steps, commits=commits, retires=retires, kills=kills
        )
        assert len(set(points)) == kills
        assert all(p.startswith(("step-", "commit-", "retire-")) for p in points), points
        assert all(reached(points, steps=steps, every=every, keep_last=keep_last)), points
        if kills >= 4 and retires:
            assert sum(p.startswith("retire-") for p in points) == 1
    with pytest.raises(ConfigError, match=f"--kills: expected 0 to {room.capacity} "):
        killpoints.choose_observed(
            rng, steps=steps, commits=commits, retires=retires, kills=room.capacity + 1
        )


def test_a_watched_run_without_a_checkpoint_before_its_end_cannot_be_drilled():
    with pytest.raises(ConfigError, match="no checkpoint before its last step 10"):
        killpoints.choose_observed(random.Random(0), steps=10, commits=[10], retires=[], kills=1)


def test_every_field_of_a_commands_record_is_compared(tmp_path):
    journal(tmp_path / "a", [{"step": 1, "loss": 0.5, "acc": 3, "tag": "x"}])
    journal(tmp_path / "b", [{"step": 1, "loss": 0.5000001, "acc": 4}])
    assert compare_steps(tmp_path / "a", tmp_path / "b", Level()) == [
        "step 1: acc differs",
        "step 1: loss 0.5 (reference) vs 0.5000001 (drilled)",
        "step 1: tag present in one run only",
    ]
    close = Level("tolerance", atol=1e-6)
    assert compare_steps(tmp_path / "a", tmp_path / "b", close, keys=["loss"]) == []
