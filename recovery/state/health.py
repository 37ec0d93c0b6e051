"""Resume health: after a resume, does training carry on as it did before the checkpoint?

An exact resume continues the run's statistics; a bad one (optimizer moments
lost, the wrong weights) departs from them. The :class:`HealthMonitor` is a
piece of the run's state: every step it records the loss and the *update
size* (the relative change of a fixed sample of parameter elements per unit
of learning rate, from :class:`UpdateProbe`), and each checkpoint carries the
last ``health.history`` of those records. After a resume, the first steps are
compared with the trend of the history (:func:`judge`) in units of the
history's own prediction error (:func:`backtest`); beyond ``health.band``
the monitor warns.

Why the update size: the loss alone barely moves when Adam's moments are lost
(on the embedding recipe the next 20 steps' mean loss moved by 0.5 % against a
4 % step-to-step spread), but a restarted Adam's first update is far from a
warmed-up Adam's, and the update size is smooth enough to show it: 10 to 11
prediction errors on that recipe, where exact resumes stayed within 1.4
(README, "Resume health").
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from recovery.config import BACKTESTS, HealthConfig

LOSS = "loss"
UPDATE = "update"
OK, WARN, SKIPPED = "ok", "warn", "skipped"


@dataclass(frozen=True)
class Signal:
    """One signal's comparison: the window's mean against the history's extrapolated trend."""

    observed: float
    expected: float
    se: float
    z: float


@dataclass
class Verdict:
    """How the first steps after a resume compare with the steps before it."""

    status: str
    resumed_at: int
    steps: int
    band: float
    signals: dict[str, Signal] = field(default_factory=dict)
    reason: str = ""

    @property
    def departed(self) -> list[str]:
        """The signals beyond the band."""
        return [name for name, s in self.signals.items() if abs(s.z) > self.band]

    def record(self) -> dict[str, Any]:
        """The ``resume_health`` event for ``metrics.jsonl``."""
        return {
            "event": "resume_health",
            "status": self.status,
            "resumed_at": self.resumed_at,
            "steps": self.steps,
            "band": self.band,
            "departed": self.departed,
            "signals": {
                name: {"observed": s.observed, "expected": s.expected, "se": s.se, "z": s.z}
                for name, s in self.signals.items()
            },
            **({"reason": self.reason} if self.reason else {}),
        }

    def describe(self) -> str:
        """One line for the log."""
        if self.status == SKIPPED:
            return f"resume health at step {self.resumed_at}: not judged ({self.reason})"
        parts = [
            f"{name} {s.observed:.4g} vs expected {s.expected:.4g} (z={s.z:+.1f})"
            for name, s in self.signals.items()
        ]
        head = "DEPARTED" if self.status == WARN else "ok"
        return (
            f"resume health {head} over the {self.steps} steps after step {self.resumed_at} "
            f"(band {self.band:g}): " + "; ".join(parts)
        )


def _line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least-squares line: (mean x, mean y, slope)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return mx, my, slope


def extrapolate(xs: Sequence[float], ys: Sequence[float], at: Sequence[float]) -> float:
    """The mean over ``at`` of the least-squares line through ``(xs, ys)``."""
    if len(xs) < 2 or len(xs) != len(ys) or not at:
        raise ValueError(f"extrapolate: need >= 2 paired points and a target, got {len(xs)}")
    mx, my, slope = _line(xs, ys)
    return my + slope * (sum(at) / len(at) - mx)


def backtest(xs: Sequence[float], ys: Sequence[float], *, fit: int, window: int) -> float:
    """How well a ``fit``-point trend predicts the mean of the next ``window`` on this series.

    Every split of the series with ``fit`` points before it and ``window``
    after is predicted the way a resume is; the result is the root mean square
    of those prediction errors. It carries the series' own noise, curvature and
    autocorrelation, which a residual-based standard error would not.
    """
    errors = [
        sum(ys[j : j + window]) / window
        - extrapolate(xs[j - fit : j], ys[j - fit : j], xs[j : j + window])
        for j in range(fit, len(ys) - window + 1)
    ]
    if not errors:
        raise ValueError(f"backtest: {len(ys)} points hold no fit of {fit} and window of {window}")
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def judge(
    history: Sequence[dict[str, float]],
    after: Sequence[dict[str, float]],
    *,
    window: int,
    fit: int,
    band: float,
) -> Verdict:
    """Compare the records ``after`` a resume with the ``history`` before it.

    Each record has ``step`` and, where measured, ``loss`` and ``update``.

    - ``loss``: the mean of the first ``window`` steps after the resume
      against the trend of the last ``fit`` steps before it (loss is noisy
      step to step; a window averages that out);
    - ``update`` (log scale): the first step after the resume against the
      same trend (a lost optimizer state shows most in the first update and
      fades within tens of steps).

    Each departure is divided by the series' own :func:`backtest` error over
    the history; a signal beyond ``band`` warns. Too short a history gives
    ``skipped``.
    """
    resumed_at = int(history[-1]["step"]) if history else 0
    need = fit + window + BACKTESTS
    signals: dict[str, Signal] = {}
    for name, span in ((LOSS, window), (UPDATE, 1)):
        before = [(r["step"], _scale(name, r[name])) for r in history if _usable(r, name)]
        now = [(r["step"], _scale(name, r[name])) for r in after if _usable(r, name)][:span]
        if len(before) < need or not now:
            continue
        xs, ys = [s for s, _ in before], [v for _, v in before]
        expected = extrapolate(xs[-fit:], ys[-fit:], [s for s, _ in now])
        observed = sum(v for _, v in now) / len(now)
        # a constant series predicts itself exactly; keep rounding from reading as a departure
        se = max(backtest(xs, ys, fit=fit, window=len(now)), 1e-9 * max(1.0, abs(expected)))
        z = (observed - expected) / se
        signals[name] = Signal(_unscale(name, observed), _unscale(name, expected), se, z)
    if not signals:
        return Verdict(
            SKIPPED,
            resumed_at,
            len(after),
            band,
            reason=f"{len(history)} steps of history; a judgement needs {need}",
        )
    verdict = Verdict(OK, resumed_at, len(after), band, signals)
    if verdict.departed:
        verdict.status = WARN
    return verdict


def _usable(record: dict[str, float], name: str) -> bool:
    value = record.get(name)
    if not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return name != UPDATE or value > 0


def _scale(name: str, value: float) -> float:
    return math.log(value) if name == UPDATE else float(value)


def _unscale(name: str, value: float) -> float:
    return math.exp(value) if name == UPDATE else value


def _local(p: torch.Tensor) -> torch.Tensor:
    to_local = getattr(p, "to_local", None)
    return to_local() if callable(to_local) else p


class UpdateProbe:
    """The size of one optimizer step: how far a fixed sample of parameter elements moves.

    :meth:`before` copies the sample (``sample`` elements spread evenly over
    every parameter, so the cost does not grow with the model);
    :meth:`after` returns ``|Δθ| / |θ|`` over it.
    """

    def __init__(self, params: Iterable[torch.Tensor], sample: int) -> None:
        # a sharded parameter (FSDP2's DTensor) is followed on this rank's shard
        self.params = [p for p in map(_local, params) if p.numel() > 0]
        total = sum(p.numel() for p in self.params)
        self.index: list[torch.Tensor] = []
        for p in self.params:
            share = max(1, round(sample * p.numel() / total)) if total else 1
            stride = max(1, p.numel() // share)
            self.index.append(torch.arange(0, p.numel(), stride, device=p.device)[:share])
        self._before: list[torch.Tensor] | None = None

    def _take(self) -> list[torch.Tensor]:
        with torch.no_grad():
            return [
                _local(p).detach().reshape(-1).index_select(0, i).double()
                for p, i in zip(self.params, self.index, strict=True)
            ]

    def before(self) -> None:
        """Copy the sample; call just before the optimizer step."""
        self._before = self._take()

    def after(self) -> float:
        """The relative change of the sample since :meth:`before`."""
        if self._before is None:
            raise RuntimeError("UpdateProbe.after() without before()")
        now = self._take()
        delta = sum(float((a - b).pow(2).sum()) for a, b in zip(now, self._before, strict=True))
        size = sum(float(b.pow(2).sum()) for b in self._before)
        self._before = None
        return math.sqrt(delta / size) if size > 0 else math.sqrt(delta)


class HealthMonitor:
    """Records each step's loss and update size; judges the first steps after a resume.

    Register it in the :class:`~recovery.state.registry.TrainState` (as ``health``) so
    its history travels in every checkpoint; loading it arms the judgement.
    """

    def __init__(self, cfg: HealthConfig, *, basis: str = "replicated") -> None:
        self.cfg = cfg
        self.basis = basis
        """What the update probe samples: ``replicated`` parameters (the same at any world
        size), or one rank's shard (``sharded:<world>:<rank>``), which a resume on
        another world size does not continue."""
        self.history: deque[dict[str, float]] = deque(maxlen=cfg.history)
        self._before: list[dict[str, float]] | None = None
        self._after: list[dict[str, float]] = []

    def observe(self, step: int, *, loss: float, lr: float, update: float | None) -> Verdict | None:
        """Record one step; return the verdict when the window after a resume is complete.

        ``update`` is the probe's relative update size; it is divided by ``lr``
        so that the schedule's own changes are not mistaken for a departure.
        """
        record: dict[str, float] = {"step": float(step), LOSS: float(loss)}
        if update is not None and lr > 0:
            record[UPDATE] = update / lr
        self.history.append(record)
        if self._before is None:
            return None
        self._after.append(record)
        if len(self._after) < self.cfg.window:
            return None
        return self.finish()

    def finish(self) -> Verdict | None:
        """Judge now with the steps seen so far (a run that ends inside the window)."""
        if self._before is None or not self._after:
            return None
        verdict = judge(
            self._before,
            self._after,
            window=self.cfg.window,
            fit=self.cfg.fit,
            band=self.cfg.band,
        )
        self._before, self._after = None, []
        return verdict

    def state_dict(self) -> dict[str, Any]:
        return {"history": [dict(r) for r in self.history], "basis": self.basis}

    def check_state_dict(self, state: Any) -> list[str]:
        if not isinstance(state, dict) or not isinstance(state.get("history"), list):
            return ["health: checkpoint entry is not a health history"]
        if any(not isinstance(r, dict) or "step" not in r for r in state["history"]):
            return ["health: a history record has no step"]
        return []

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the history and arm the judgement of the steps that follow."""
        self.history.clear()
        self.history.extend(dict(r) for r in state["history"])
        self._before = list(self.history)
        self._after = []
        if state.get("basis", "replicated") != self.basis:
            # the probe now samples other elements: judge the loss alone
            self._before = [{k: v for k, v in r.items() if k != UPDATE} for r in self._before]
            self.history.clear()
            self.history.extend(self._before)
