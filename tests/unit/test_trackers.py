"""The trackers' config, their absence when off, the TensorBoard directory rule, and a
tracking server that is down (the run goes on; one warning)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from recovery.errors import ConfigError
from recovery.run import trackers
from recovery.run.journal import Journal, read
from recovery.run.trackers import MlflowConfig, TensorBoardConfig, TrackersConfig

REPO = Path(__file__).resolve().parents[2]


def test_nothing_is_imported_or_written_when_no_tracker_is_enabled(tmp_path):
    code = f"""
import sys
from pathlib import Path
from recovery.run import trackers
from recovery.run.journal import Journal
run = Path({str(tmp_path / "r")!r})
journal = Journal(run / "metrics.jsonl")
assert trackers.attach(journal, trackers.TrackersConfig(), run_dir=run) == []
journal.write({{"event": "start", "run_id": "a"}})
journal.step(1, loss=1.0)
journal.close()
print(sorted({{m.split('.')[0] for m in sys.modules}} & {{"mlflow", "tensorboard"}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "r",
        "r/metrics.jsonl",
        "r/metrics.jsonl.index",  # the journal's own index, nothing of a tracker's
    ]


def test_tensorboard_directory_defaults_to_runs_and_is_never_inside_the_run(tmp_path):
    run = tmp_path / "ck" / "r"
    assert trackers.log_dir(TensorBoardConfig(), run) == Path("runs") / "r"
    job = "r.sweep/seed=0"  # a sweep job: its whole name, never another run's directory
    assert trackers.log_dir(TensorBoardConfig(), run, job) == Path("runs") / "r.sweep" / "seed=0"
    assert trackers.log_dir(TensorBoardConfig(log_dir="tb/x"), run) == Path("tb/x")
    with pytest.raises(ConfigError, match="inside the run directory"):
        trackers.log_dir(TensorBoardConfig(log_dir=str(run / "tb")), run)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"enabled": True}, "tracking_uri: unset"),
        ({"close_timeout": "soon"}, "close_timeout: .*set e.g. "),
        ({"enabled": True, "tracking_uri": "http://h", "experiment": ""}, "experiment: .*set e.g"),
    ],
)
def test_a_bad_mlflow_setting_is_refused_at_start_up(monkeypatch, fields, message):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ConfigError, match=message):
        MlflowConfig(**fields)


def test_an_empty_tensorboard_directory_is_refused_in_one_line_with_a_value_to_set():
    with pytest.raises(ConfigError, match=r"^trackers.tensorboard.log_dir: .*set e.g. "):
        TensorBoardConfig(log_dir=" ")


def test_the_environments_tracking_uri_is_enough(monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert MlflowConfig(enabled=True).uri == "http://127.0.0.1:5000"


def test_a_dead_tracking_server_costs_one_warning_and_never_the_run(tmp_path, monkeypatch, caplog):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    with socket_closed() as port:
        cfg = TrackersConfig(
            mlflow=MlflowConfig(
                enabled=True, tracking_uri=f"http://127.0.0.1:{port}", close_timeout="2s"
            )
        )
        run = tmp_path / "r"
        journal = Journal(run / "metrics.jsonl")
        assert len(trackers.attach(journal, cfg, run_dir=run)) == 1
        journal.write({"event": "start", "run_id": "a"})
        for step in range(1, 4):
            journal.step(step, loss=1.0 / step)
        journal.close()
    assert [r["step"] for r in read(run / "metrics.jsonl") if "step" in r] == [1, 2, 3]
    failed = [r for r in caplog.records if "MLflow tracking failed" in r.getMessage()]
    assert len(failed) == 1 and "training goes on" in failed[0].getMessage()


class socket_closed:
    """A port on 127.0.0.1 that nothing listens on (bound, never listening)."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        return int(self.sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
