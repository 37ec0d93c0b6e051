"""When the next checkpoint is due: fixed steps/seconds, or the Young/Daly optimum.

With ``checkpoint.interval=auto`` the interval is sqrt(2 * C * MTBF), where C
is the measured cost of a save to the run (the pause for async saves, the
whole save for synchronous ones), re-estimated after every save as the mean of
the measurements so far, and never shorter than the time a save takes to
persist (a save cannot be due before the previous one is durable). Until the
first save has been measured, ``every_steps`` applies.

The arithmetic lives in :mod:`recovery.run.policy`; this class only keeps the
measurements and the clock.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from statistics import fmean
from typing import Any

from recovery.config import CheckpointConfig, parse_duration
from recovery.run import policy

log = logging.getLogger(__name__)


class Cadence:
    """Decides, after each step, whether a checkpoint is due."""

    def __init__(
        self, cfg: CheckpointConfig, *, final_step: int, clock: Any = time.monotonic
    ) -> None:
        self.cfg = cfg
        self.final_step = final_step
        self.clock = clock
        self.mtbf_s = parse_duration(cfg.mtbf)
        self.last_step: int | None = None
        self.last_time = clock()
        self.costs: list[float] = []
        self.persist: list[float] = []
        self.interval_s: float | None = None

    @property
    def auto(self) -> bool:
        return self.cfg.interval == "auto"

    def due(self, step: int) -> bool:
        """Whether to checkpoint after ``step``."""
        if self.auto and self.interval_s is not None:
            every_steps, every_seconds = 0, self.interval_s
        else:
            every_steps, every_seconds = self.cfg.every_steps, self.cfg.every_seconds
        return policy.due(
            step,
            self.clock(),
            every_steps=every_steps,
            every_seconds=every_seconds,
            final_step=self.final_step,
            last_step=self.last_step,
            last_time=self.last_time,
        )

    def saved(self, step: int) -> None:
        """A save of ``step`` started now (the interval counts from here)."""
        self.last_step = step
        self.last_time = self.clock()

    def measured(self, cost_s: float, persist_s: float) -> None:
        """Record one save's cost to the run and its time to persist; re-plan if auto."""
        self.costs.append(cost_s)
        self.persist.append(persist_s)
        if self.auto:
            c, p = fmean(self.costs), fmean(self.persist)
            self.interval_s = policy.auto_interval(c, self.mtbf_s, p)
            log.info(
                "checkpoint interval (auto): sqrt(2 x C=%.4fs x MTBF=%.0fs) = %.2fs; "
                "persist %.4fs; saving every %.2fs",
                c,
                self.mtbf_s,
                policy.young_daly(c, self.mtbf_s),
                p,
                self.interval_s,
            )

    def describe(self) -> dict[str, Any]:
        """The choice and its arithmetic, for provenance."""
        out: dict[str, Any] = {
            "mode": self.cfg.interval,
            "every_steps": self.cfg.every_steps,
            "every_seconds": self.cfg.every_seconds,
        }
        if self.auto:
            out.update(
                mtbf_s=self.mtbf_s,
                cost_s=fmean(self.costs) if self.costs else None,
                persist_s=fmean(self.persist) if self.persist else None,
                seconds=self.interval_s,
                formula="max(sqrt(2 * cost_s * mtbf_s), persist_s)",
            )
        return out

    def summary(self, run_s: float, pause_s: float) -> dict[str, Any]:
        """The journal's ``run_summary`` record: the checkpoint fraction of the run's time."""
        return {
            "event": "run_summary",
            "run_s": run_s,
            "checkpoint_pause_s": pause_s,
            "checkpoint_fraction": pause_s / run_s if run_s > 0 else None,
            "interval": self.describe(),
        }


def first_step(step: int, *, resumed: bool) -> dict[str, Any]:
    """The journal's ``first_step`` record: how long this process took to train again."""
    return {
        "event": "first_step",
        "step": step,
        "resumed": resumed,
        "seconds_since_process_start": process_age_s(),
    }


def process_age_s() -> float | None:
    """Seconds since this process started (Linux ``/proc``); ``None`` elsewhere."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
