"""An MLflow run of a training run: one across its resumes, fed from the run's journal.

The training thread only queues the journal's records (a bounded queue,
:data:`QUEUE`); a background thread creates or continues the MLflow run and sends
them (:class:`mlflow.tracking.MlflowClient`, never the fluent API's global active
run), so a slow or dead server never stalls a step, nor the run's start. A request
that fails is retried (every few seconds, one warning) while the records behind it
wait in the queue; a full queue drops what comes next from the live view, once said
(``metrics.jsonl`` keeps every record, and a resume backfills its steps); at the
run's end the sender gets ``trackers.mlflow.close_timeout`` to finish. What is
logged:

- each per-step record's numbers (``loss``, ``lr``, ``epoch``, ``update``) as metrics
  at their ``step``, in batches;
- a fresh run creates the MLflow run (tag ``recovery.run_id``) and journals its id,
  ``{"event": "mlflow_run", "mlflow_run_id": ...}``, when the sender gets to it. A resume
  reads that id back from the journal (else, the process before killed first, finds
  the run by its tag), continues the same MLflow run, marks
  the resume (metric ``resumed_at``, tags ``recovery.resumes`` and
  ``recovery.resume.<n>``), and backfills from the journal the steps up to the
  checkpoint that the killed process had not sent yet;
- each commit: metrics ``checkpoint/pause_s|wait_s|write_s|mb`` and its lineage
  (name, purpose, digest, signer, previous, parent) as the artifact
  ``checkpoints/<name>.json`` and the tags ``recovery.checkpoint[.sha256]``;
- each self-check verdict: tag ``recovery.resume.<n>.check``;
- the end: the run ``FINISHED``, ``KILLED`` when preempted, ``FAILED`` when the run
  ended without its summary.

A redone step (after the checkpoint, before the kill) is in the metric's history
twice, the dead process's value and the resume's: equal when the resume is exact,
which the self-check states. The ``mlflow_run`` event is not sealed: it steers where
metrics go, never what a resume restores. :mod:`recovery.run.trackers.exports` makes an
export a model version of the registered model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from recovery.config import parse_duration
from recovery.run import journal as journal_mod
from recovery.run.journal import Journal
from recovery.run.restoring import selfcheck
from recovery.run.trackers.base import Tracker, finite, scalars
from recovery.run.trackers.config import MlflowConfig

log = logging.getLogger(__name__)

EVENT = "mlflow_run"
RUN_TAG = "recovery.run_id"
BATCH = 900
"""Metrics per request (the server takes up to 1000)."""
FLUSH_S = 2.0
"""At most this long between a step's record and its request."""
QUEUE = 10_000
"""Records held for a slow or unreachable server before the live view drops any."""
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)
"""Waits between the tries of a failed request (the last repeats)."""
_STOP = object()
_ABSORBED = "_mlflow_absorbed"
"""Marks a record whose numbers are already in the pending batch (a retry adds none)."""

# a dead server must fail fast, not retry for minutes, and the library prints nothing
# (MLflow prints the run's address when it ends); the user's environment wins
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def client_for(cfg: MlflowConfig) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=cfg.uri)


def experiment(client: Any, name: str) -> str:
    found = client.get_experiment_by_name(name)
    return str(found.experiment_id) if found is not None else str(client.create_experiment(name))


def recorded_run(path: Path | None, run_id: str) -> str | None:
    """The MLflow run id the journal at ``path`` recorded for run ``run_id`` (the last)."""
    if path is None or not path.is_file():
        return None
    ids = [
        r.get("mlflow_run_id")
        for r in journal_mod.read(path)
        if r.get("event") == EVENT and r.get("run_id") == run_id
    ]
    return str(ids[-1]) if ids and ids[-1] else None


def find_run(client: Any, cfg: MlflowConfig, path: Path | None, run_id: str) -> str | None:
    """Run ``run_id``'s MLflow run: the one its journal names, else the one tagged with it."""
    recorded = recorded_run(path, run_id)
    if recorded is not None:
        return recorded
    found = client.search_runs(
        [experiment(client, cfg.experiment)],
        filter_string=f"tags.`{RUN_TAG}` = '{run_id}'",
        max_results=1,
    )
    return str(found[0].info.run_id) if found else None


class MlflowTracker(Tracker):
    """Logs the journal of the run at ``run_dir`` to ``cfg``'s tracking server."""

    name = "MLflow"

    def __init__(self, cfg: MlflowConfig, journal: Journal, *, run_name: str) -> None:
        self.cfg = cfg
        self.journal = journal
        self.run_name = run_name
        self.mlflow_run_id: str | None = None
        self.status = "FAILED"
        self.dropped = 0
        """Records the full queue dropped from the live view."""
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=QUEUE)
        self._pending: list[Any] = []
        self._client: Any = None
        self._deadline: float | None = None
        """When the run's end stops waiting for the sender (``close_timeout`` after it)."""
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mlflow-tracker", daemon=True)
        self._thread.start()

    def handle(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event == "preempted":
            self.status = "KILLED"
        elif event == "run_summary" and self.status != "KILLED":
            self.status = "FINISHED"
        if event == EVENT or self.failed:
            return
        try:  # never waits: a step goes on whatever the server does
            self._queue.put_nowait(dict(record))
        except queue.Full:
            if not self.dropped:
                log.warning(
                    "MLflow: %d records wait for the tracking server; the live view drops "
                    "records from here (metrics.jsonl keeps every one, and a resume "
                    "backfills its steps)",
                    QUEUE,
                )
            self.dropped += 1

    def finish(self) -> None:
        timeout = parse_duration(self.cfg.close_timeout)
        self._deadline = time.monotonic() + timeout  # a retry waits no longer than this
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._wake.set()  # a retry waiting its turn tries once more now
        self._thread.join(max(0.0, self._deadline - time.monotonic()))
        if self._thread.is_alive():
            self.fail(
                TimeoutError(
                    f"records not sent within trackers.mlflow.close_timeout "
                    f"({self.cfg.close_timeout}); a resume backfills its steps"
                )
            )

    # -- the background thread ----------------------------------------------------

    def _loop(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=FLUSH_S if self._pending else None)
            except queue.Empty:
                item = None
            if self.failed:
                if item is _STOP:
                    return
                continue
            if item is _STOP:
                self._retrying(self._end)
                return
            self._retrying(self._flush if item is None else lambda item=item: self._process(item))

    def _end(self) -> None:
        self._flush()
        if self.mlflow_run_id is not None:
            self._c().set_terminated(self.mlflow_run_id, self.status)

    def _retrying(self, send: Any) -> None:
        """``send()`` until it succeeds; a failure is said once, and retried after a wait,
        while the records behind it wait in the queue; past the run's end's deadline the
        tracker is turned off (:meth:`~recovery.run.trackers.base.Tracker.fail`)."""
        for attempt in range(1 << 30):
            try:
                send()
                return
            except Exception as err:
                now = time.monotonic()
                if self._deadline is not None and now >= self._deadline:
                    self.fail(err)
                    return
                if attempt == 0:
                    log.warning(
                        "MLflow: the tracking server did not take a request (%s); retrying, "
                        "training goes on and records wait in the queue",
                        str(err).splitlines()[0] if str(err) else type(err).__name__,
                    )
                wait = RETRY_S[min(attempt, len(RETRY_S) - 1)]
                if self._deadline is not None:
                    wait = min(wait, self._deadline - now)
                if self._wake.wait(wait):  # the run ends: once more now, then at the deadline
                    self._wake.clear()

    def _c(self) -> Any:
        if self._client is None:
            self._client = client_for(self.cfg)
        return self._client

    def _metric(self, key: str, value: float, step: int) -> Any:
        from mlflow.entities import Metric

        return Metric(key, value, int(time.time() * 1000), step)

    def _flush(self, keep: int = 0) -> None:
        """Send the pending metrics but the last ``keep``, a batch at a time, each dropped
        from the pending list once the server took it."""
        while len(self._pending) > keep and self.mlflow_run_id is not None:
            batch = self._pending[: min(BATCH, len(self._pending) - keep)]
            self._c().log_batch(self.mlflow_run_id, metrics=batch)
            self._pending = self._pending[len(batch) :]

    def _absorb(self, record: dict[str, Any], metrics: list[Any]) -> None:
        """Add ``record``'s metrics to the pending batch, once (a retried record adds none)."""
        if not record.get(_ABSORBED):
            self._pending += metrics
            record[_ABSORBED] = True

    def _process(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event in ("start", "warm_start"):
            if not record.get(_ABSORBED):  # created once, whatever a retry meets after
                self._create(str(record.get("run_id")))
                record[_ABSORBED] = True
            return
        if event == "resume":
            self._resume(record)
            return
        if event is None:
            step = record.get("step")
            if isinstance(step, int):
                self._absorb(record, [self._metric(k, v, step) for k, v in scalars(record).items()])
                if len(self._pending) >= BATCH:
                    self._flush()
            return
        if event == "checkpoint":
            self._checkpoint(record)
        elif event == "resume_check" and record.get("summary"):
            n = self._resumes()
            if self.mlflow_run_id is not None and n:
                self._c().set_tag(
                    self.mlflow_run_id, f"recovery.resume.{n}.check", selfcheck.verdict(record)
                )

    def _create(self, run_id: str) -> None:
        client = self._c()
        run = client.create_run(
            experiment(client, self.cfg.experiment),
            run_name=self.run_name,
            tags={RUN_TAG: run_id, "recovery.run_name": self.run_name},
        )
        self.mlflow_run_id = str(run.info.run_id)
        self.journal.write({"event": EVENT, "run_id": run_id, "mlflow_run_id": self.mlflow_run_id})

    def _resumes(self) -> int:
        if self.mlflow_run_id is None:
            return 0
        tags = self._c().get_run(self.mlflow_run_id).data.tags
        return int(tags.get("recovery.resumes", "0"))

    def _resume(self, record: dict[str, Any]) -> None:
        client = self._c()
        run_id, step = str(record.get("run_id")), int(record.get("step", 0))
        found = find_run(client, self.cfg, self.journal.path, run_id)
        if found is None:
            log.warning(
                "MLflow: no run recorded for run %s; logging its resume to a new one", run_id
            )
            self._create(run_id)
        else:
            self.mlflow_run_id = found
            client.update_run(found, status="RUNNING")
            if recorded_run(self.journal.path, run_id) != found:
                self.journal.write({"event": EVENT, "run_id": run_id, "mlflow_run_id": found})
        assert self.mlflow_run_id is not None
        n = self._resumes() + 1
        client.set_tag(self.mlflow_run_id, "recovery.resumes", str(n))
        client.set_tag(
            self.mlflow_run_id, f"recovery.resume.{n}", f"at step {step} from {record.get('from')}"
        )
        client.log_metric(self.mlflow_run_id, "resumed_at", float(step), step=step)
        self._backfill(step)
        self._flush()

    def _backfill(self, upto: int) -> None:
        """Send the journal's steps up to ``upto`` that the MLflow run lacks (a process
        killed before it sent them, or a tracker that failed)."""
        path = self.journal.path
        if path is None or not path.is_file() or self.mlflow_run_id is None:
            return
        steps = {s: r for s, r in journal_mod.effective_steps(path).items() if s <= upto}
        keys = {k for r in steps.values() for k in scalars(r)}
        for key in sorted(keys):
            have = {m.step for m in self._c().get_metric_history(self.mlflow_run_id, key)}
            for step, record in sorted(steps.items()):
                value = scalars(record).get(key)
                if value is not None and step not in have:
                    self._pending.append(self._metric(key, value, step))

    def _checkpoint(self, record: dict[str, Any]) -> None:
        if self.mlflow_run_id is None:
            return
        from mlflow.entities import RunTag

        step = int(record.get("step", 0))
        costs = [
            self._metric(f"checkpoint/{key}", record[key], step)
            for key in ("pause_s", "wait_s", "write_s")
            if finite(record.get(key))
        ]
        if finite(record.get("bytes")):
            costs.append(self._metric("checkpoint/mb", record["bytes"] / 1e6, step))
        self._absorb(record, costs)
        artifact = record.get("artifact")
        if not isinstance(artifact, dict):
            self._flush()
            return
        name = str(artifact.get("name"))
        tags = [
            RunTag("recovery.checkpoint", name),
            RunTag("recovery.checkpoint.sha256", str(artifact.get("sha256"))),
        ]
        # the last batch before a commit carries its tags: one request fewer per commit
        self._flush(keep=min(BATCH, len(self._pending)))
        self._c().log_batch(self.mlflow_run_id, metrics=self._pending, tags=tags)
        self._pending = []
        self._c().log_dict(self.mlflow_run_id, artifact, f"checkpoints/{name}.json")
