"""TensorBoard event files of a run, written from its journal.

Scalars: each per-step record's numbers (``loss``, ``lr``, ``epoch``, ``update``)
at their step; ``checkpoint/pause_s``, ``checkpoint/wait_s``, ``checkpoint/write_s``,
``checkpoint/mb`` at each commit's step; ``resume/at_step`` at each resume;
``resume_check/compared`` and ``resume_check/identical`` with each self-check
verdict. Text: ``run`` (start, resumes, preemption, end), ``checkpoint`` (each
commit's lineage: digest, signer, previous, parent), ``resume_check`` (the
verdict in words), ``resume_health`` and ``warning``.

A resume writes TensorBoard's own restart marker (``SessionLog.START``) at the
first step it redoes: TensorBoard then drops what the killed process had logged
from that step on, and shows one series, the surviving run's. Every commit
flushes the event file, so a kill loses only steps after the last checkpoint,
which the resume redoes. Each process writes its own event file in the same
directory (TensorBoard reads them in order).

Rejected: the log directory inside the run directory (it holds only the run, and
DVC tracks it): the default is ``runs/<run name>``, TensorBoard's usual ``runs/``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from recovery.run.restoring import selfcheck
from recovery.run.trackers.base import Tracker, finite, scalars

FLUSH_S = 10
"""Between commits, the writer's own flush interval (seconds)."""


class TensorBoardTracker(Tracker):
    """Writes the run's event files under ``log_dir`` (created with the first record)."""

    name = "TensorBoard"

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._writer: Any = None
        self._step = 0

    def _w(self) -> Any:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(self.log_dir), flush_secs=FLUSH_S)
        return self._writer

    def _text(self, tag: str, text: str, step: int | None = None) -> None:
        self._w().add_text(tag, text, self._step if step is None else step)

    def handle(self, record: dict[str, Any]) -> None:
        event = record.get("event")
        if event is None:
            step = record.get("step")
            if isinstance(step, int):
                self._step = step
                for key, value in scalars(record).items():
                    self._w().add_scalar(key, value, step)
            return
        handler = getattr(self, f"_on_{event}", None)
        if handler is not None:
            handler(record)
        elif event in ("preempted", "warning", "override_ignored"):
            self._text("run" if event == "preempted" else "warning", _line(record))

    def _on_start(self, record: dict[str, Any]) -> None:
        self._text("run", f"started: run id {record.get('run_id')}", 0)

    _on_warm_start = _on_start

    def _on_resume(self, record: dict[str, Any]) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        step = int(record.get("step", 0))
        self._step = step
        writer = self._w()
        # TensorBoard's restart marker: the dead process's events from here on are dropped
        writer._get_file_writer().add_event(
            Event(
                step=step + 1,
                wall_time=time.time(),
                session_log=SessionLog(status=SessionLog.START),
            )
        )
        writer.add_scalar("resume/at_step", step, step)
        self._text("run", f"resumed at step {step} from {record.get('from')}", step)

    def _on_resume_check(self, record: dict[str, Any]) -> None:
        if not record.get("summary") and record.get("status") != selfcheck.INEXACT:
            return
        step = int(record.get("resumed_at", self._step))
        self._text("resume_check", f"resumed at step {step}: {selfcheck.verdict(record)}", step)
        if record.get("summary"):
            for key in ("compared", "identical"):
                if finite(record.get(key)):
                    self._w().add_scalar(f"resume_check/{key}", record[key], step)

    def _on_resume_health(self, record: dict[str, Any]) -> None:
        departed = ", ".join(record.get("departed") or []) or "none"
        self._text("resume_health", f"{record.get('status')} (departed: {departed})")

    def _on_checkpoint(self, record: dict[str, Any]) -> None:
        step = int(record.get("step", self._step))
        writer = self._w()
        for key in ("pause_s", "wait_s", "write_s"):
            if finite(record.get(key)):
                writer.add_scalar(f"checkpoint/{key}", record[key], step)
        if finite(record.get("bytes")):
            writer.add_scalar("checkpoint/mb", record["bytes"] / 1e6, step)
        artifact = record.get("artifact")
        if isinstance(artifact, dict):
            self._text("checkpoint", _lineage(artifact), step)
        writer.flush()  # a kill after this commit loses only steps its resume redoes

    def _on_run_summary(self, record: dict[str, Any]) -> None:
        if finite(record.get("checkpoint_fraction")):
            self._w().add_scalar(
                "run/checkpoint_fraction", record["checkpoint_fraction"], self._step
            )

    def finish(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _lineage(artifact: dict[str, Any]) -> str:
    """One commit's lineage in a line of text."""
    keys = ("name", "purpose", "sha256", "signer", "previous", "parent")
    return ", ".join(f"{k} {artifact.get(k)}" for k in keys)


def _line(record: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in record.items() if k not in ("prev", "auth")})
