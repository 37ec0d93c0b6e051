"""The trackers on a killed-and-resumed run: one MLflow run (a real ``mlflow server`` on
127.0.0.1, SQLite store) and one TensorBoard series (read by TensorBoard's own reader)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from recovery.format.layout import METRICS_FILE, step_dir_name
from recovery.integrity.reads.reader import read_manifest
from recovery.run.journal import effective_steps, read
from tests.integration.conftest import SMALL, STEPS, recovery_export

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra is not installed")
pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")

RESUMED_AT = 40  # checkpoints every 10 steps; killed at 45, after 41-45 were journaled


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_started(tmp_path_factory):
    """A real tracking server (SQLite store, artifacts served) starting: requested first, so
    that its start-up overlaps the reference run's, and stopped with this module (not held
    to the session's end). Without MLflow's job runner: the server would otherwise start
    about ten ``huey`` consumer processes, polling for jobs (none here) for as long as it
    runs (about a third of a core on the 2-core machine); runs, metrics and artifacts,
    what the test reads, do not use it."""
    where = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    exe = Path(sys.executable).with_name("mlflow")
    with open(where / "server.log", "w") as log:
        proc = subprocess.Popen(
            [
                str(exe),
                "server",
                "--backend-store-uri",
                f"sqlite:///{where / 'mlflow.db'}",
                "--artifacts-destination",
                str(where / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
    yield proc, f"http://127.0.0.1:{port}", where / "server.log"
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture
def mlflow_server(mlflow_started):
    """The server's address, once it answers."""
    proc, uri, log = mlflow_started
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    return uri
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail("mlflow server did not start:\n" + log.read_text())
        time.sleep(0.3)


def test_killed_and_resumed_run_is_one_mlflow_run_and_one_tensorboard_series(
    mlflow_started, tmp_path, trainer, reference, mlflow_server, trust, signer, data_root
):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing import event_accumulator as ea

    root = tmp_path / "run"
    tracked = (
        "trackers.tensorboard.enabled=true",
        "trackers.mlflow.enabled=true",
        f"trackers.mlflow.tracking_uri={mlflow_server}",
        "trackers.mlflow.experiment=killed-and-resumed",
    )
    killed = trainer(root, *tracked, pause_at="step-45")
    assert killed.returncode == -9, killed.output
    resumed = trainer(root, *tracked, "+resume=latest")
    assert resumed.returncode == 0, resumed.output
    assert "tracking failed" not in resumed.output
    run_dir = resumed.run_dir
    journal = read(run_dir / METRICS_FILE)
    run_id = next(r["run_id"] for r in journal if r.get("event") == "start")
    ref = effective_steps(reference / METRICS_FILE)

    # MLflow: one run, continued, its resume marked, every step's loss the reference's
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name("killed-and-resumed")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1
    run = runs[0]
    ids = {r["mlflow_run_id"] for r in journal if r.get("event") == "mlflow_run"}
    assert ids == {run.info.run_id}  # kept in the journal, continued by the resume
    tags = run.data.tags
    assert run.info.status == "FINISHED"
    assert tags["recovery.run_id"] == run_id
    assert tags["recovery.resumes"] == "1"
    assert tags["recovery.resume.1"].startswith(f"at step {RESUMED_AT} from ")
    assert "bit-identical" in tags["recovery.resume.1.check"]
    marks = client.get_metric_history(run.info.run_id, "resumed_at")
    assert [(m.step, m.value) for m in marks] == [(RESUMED_AT, float(RESUMED_AT))]
    history = client.get_metric_history(run.info.run_id, "loss")
    assert {m.step for m in history} == set(range(1, STEPS + 1))
    for m in history:  # a redone step is there twice: the dead process's and the resume's
        assert m.value == ref[m.step]["loss"], f"step {m.step}"
    # each checkpoint's lineage, as the signed manifest has it
    final = run_dir / step_dir_name(STEPS)
    mf = read_manifest(final, trust)
    logged = json.loads(
        Path(
            mlflow.artifacts.download_artifacts(
                run_id=run.info.run_id,
                artifact_path=f"checkpoints/{final.name}.json",
                dst_path=str(tmp_path / "dl"),
                tracking_uri=mlflow_server,
            )
        ).read_text()
    )
    assert logged["sha256"] == mf.root and logged["purpose"] == "continuation"
    assert logged["signer"] == mf.signer.key_id
    assert logged["previous"] == mf.recovery["previous"]["sha256"]
    assert logged["parent"] == mf.recovery["parent"]["sha256"]  # the checkpoint resumed from
    assert tags["recovery.checkpoint"] == final.name

    # TensorBoard: one series (the dead process's steps after the checkpoint dropped)
    acc = ea.EventAccumulator(
        str(root / "runs" / "r"), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0}
    )
    acc.Reload()
    loss = acc.Scalars("loss")
    assert [e.step for e in loss] == list(range(1, STEPS + 1))
    for e in loss:  # TensorBoard stores float32
        assert e.value == np.float32(ref[e.step]["loss"]), f"step {e.step}"
    assert [(e.step, e.value) for e in acc.Scalars("resume/at_step")] == [(RESUMED_AT, 40.0)]
    assert {e.step for e in acc.Scalars("checkpoint/write_s")} >= {10, 20, 30, 40, 50, 80}
    verdicts = [
        e.tensor_proto.string_val[0].decode() for e in acc.Tensors("resume_check/text_summary")
    ]
    assert len(verdicts) == 1 and "bit-identical" in verdicts[0]
    assert not any(p.name.startswith("events") for p in run_dir.rglob("*"))  # none in the run

    # the export: logged to the same run, a model version carrying its signature bundle
    out = tmp_path / "served"
    overrides = [*SMALL, f"checkpoint.root={root}", f"recipe.data.root={data_root}"]
    done = recovery_export([*overrides, f"export.out={out}", *tracked], signer)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not registered" not in done.stdout + done.stderr
    exported = read_manifest(out, trust)
    (version,) = client.search_model_versions("name='r'")
    assert version.run_id == run.info.run_id
    assert version.tags["recovery.sha256"] == exported.root
    assert version.tags["recovery.signer"] == exported.signer.key_id
    assert version.tags["recovery.parent.sha256"] == mf.root  # made from the last checkpoint
    assert version.tags["recovery.purpose"] == "inference"
    files = {
        Path(a.path).name
        for a in client.list_artifacts(run.info.run_id, f"exports/served-step-{STEPS}")
    }
    assert {"model.sig", "state.json", "model.safetensors"} <= files
    assert len(client.search_runs([experiment.experiment_id])) == 1


class Proxy:
    """A TCP proxy on 127.0.0.1 in front of the tracking server: ``delay`` seconds before
    each request is forwarded (a slow server), ``down()`` closes it and every connection
    (a dead one), ``up()`` listens again on the same port (back)."""

    def __init__(self, target: str, delay: float = 0.0) -> None:
        host, port = target.rsplit("//", 1)[1].split(":")
        self.target = (host, int(port))
        self.delay = delay
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.listener: socket.socket | None = None
        self.open: list[socket.socket] = []
        self.up()

    def up(self) -> None:
        import threading

        self.listener = socket.create_server(("127.0.0.1", self.port), reuse_port=False)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def down(self) -> None:
        assert self.listener is not None
        self.listener.close()
        for s in self.open:
            with contextlib.suppress(OSError):
                s.close()
        self.open.clear()

    def _accept(self, listener: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.open += [client, server]
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, slow: bool) -> None:
        try:
            while data := src.recv(65536):
                if slow:
                    time.sleep(self.delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.close()


def tracked_run(tmp_path: Path, uri: str, *, experiment: str, timeout: str = "60s"):
    from recovery.run import trackers
    from recovery.run.journal import Journal
    from recovery.run.trackers import MlflowConfig, TrackersConfig

    cfg = TrackersConfig(
        mlflow=MlflowConfig(
            enabled=True, tracking_uri=uri, experiment=experiment, close_timeout=timeout
        )
    )
    journal = Journal(tmp_path / "r" / METRICS_FILE)
    assert len(trackers.attach(journal, cfg, run_dir=tmp_path / "r")) == 1
    return journal


def logged_losses(uri: str, experiment: str) -> list[int]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    return sorted(m.step for m in client.get_metric_history(run.info.run_id, "loss"))


def test_a_slow_tracking_server_never_stalls_a_step(mlflow_server, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    proxy = Proxy(mlflow_server, delay=0.5)  # each request half a second late
    journal = tracked_run(tmp_path, proxy.uri, experiment="slow")
    began = time.perf_counter()
    journal.write({"event": "start", "run_id": "slow"})  # the MLflow run made off-thread
    for step in range(1, 51):
        journal.step(step, loss=1.0 / step)
    training_s = time.perf_counter() - began
    journal.close()  # the sender gets close_timeout to finish
    assert training_s < 1.0, training_s  # 50 steps, where one request alone takes 0.5 s
    assert logged_losses(mlflow_server, "slow") == list(range(1, 51))
    assert "tracking failed" not in caplog.text
    proxy.down()


def test_a_tracking_server_down_mid_run_and_back_loses_nothing_the_queue_holds(
    mlflow_server, tmp_path, monkeypatch, caplog
):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    proxy = Proxy(mlflow_server)
    journal = tracked_run(tmp_path, proxy.uri, experiment="down-and-back")
    journal.write({"event": "start", "run_id": "down"})
    for step in range(1, 11):
        journal.step(step, loss=1.0 / step)
    time.sleep(3)  # the first steps sent (flushed every 2 s)
    proxy.down()  # the server is gone: the run goes on, its records wait in the queue
    began = time.perf_counter()
    for step in range(11, 31):
        journal.step(step, loss=1.0 / step)
        journal.write({"event": "checkpoint", "step": step, "pause_s": 0.01, "bytes": 10})
    assert time.perf_counter() - began < 1.0
    time.sleep(3)  # the sender meets the dead server, says so once, and retries
    proxy.up()
    journal.close()
    assert logged_losses(mlflow_server, "down-and-back") == list(range(1, 31))
    retried = [r for r in caplog.records if "did not take a request" in r.getMessage()]
    assert len(retried) == 1 and "tracking failed" not in caplog.text
