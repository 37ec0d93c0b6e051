"""What the checkpointer watches while a run trains: its optimizer steps and per-step records.

Through torch's public optimizer step hooks (``register_step_pre_hook``,
``register_step_post_hook``) and the journal's per-step records
(:meth:`recovery.run.journal.Journal.watch`), so any loop gets both without
calling anything:

- **The resume health monitor.** Unless the state registers its own ``health``
  (the recipes do) or health is off, a :class:`~recovery.state.health.HealthMonitor`
  is registered as ``health`` before the restore (its history travels in every
  checkpoint). Each optimizer step is measured by an
  :class:`~recovery.state.health.UpdateProbe` (before and after the step) and its
  learning rate noted; each per-step record the run writes through its journal
  (``{"step": ..., "loss": ...}``) gets ``lr`` and ``update`` added where it lacks
  them and feeds the monitor; its verdict after a resume is logged and journaled
  (``resume_health``), at the end of the window or at :meth:`Watch.close`.
- **State changed after a save.** At a save, each registered LR scheduler's
  ``last_epoch`` and each enabled GradScaler's state is noted; at the next
  optimizer step they must be unchanged. A scheduler stepped in between (an
  epoch-end ``scheduler.step()`` after ``maybe_save``, a ``scaler.update()`` after
  it) changed the run *after* the checkpoint was taken, in code a resumed run does
  not execute again: a resume from that checkpoint trains another schedule. Warned
  once per component (log and ``{"event": "warning", "kind": "stepped_after_save"}``).
  Only these two kinds are checked: a sampler or loader moves legitimately before
  the optimizer step (it draws the batch). A scheduler stepped at the top of the
  loop before ``optimizer.step()`` (an order torch itself warns about) reads the
  same way.
- **A save before its step's update.** The optimizer steps since the run began are
  counted (its post-step hook); a checkpoint of step ``s`` taken after fewer than
  ``s - start`` of them was taken before ``optimizer.step()`` of its step (or between
  the micro-batches of an accumulated step): it holds step ``s - 1``'s parameters
  labelled ``s``, and a resume from it skips an update. Warned once
  (``save_before_step``); not judged with an enabled GradScaler registered (it skips
  the steps whose gradients overflowed).
- **A loader on the global stream after a save.** A ``DataLoader`` without
  ``generator=`` that starts an iterator after a checkpoint was taken and before the
  next optimizer step (:mod:`recovery.run.monitoring.loaderstarts`) drew its seed from the global
  torch generator in code a resumed run may not run again (an epoch's test pass after
  its last save). Warned once (``loader_after_save``).
- **The model left in eval mode.** A ``metrics`` callable (an evaluation pass,
  run only at checkpoints) that calls ``model.eval()`` and not ``model.train()``
  leaves the original run training without dropout from the first checkpoint
  on, where a resumed run trains in train mode: warned once
  (``{"event": "warning", "kind": "eval_mode_after_metrics"}``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from recovery.config import HealthConfig
from recovery.config.checkpoint import FINGERPRINT_AUTO
from recovery.parallel import sharded
from recovery.parallel import world as distributed
from recovery.run.journal import Journal
from recovery.run.monitoring import loaderstarts
from recovery.run.monitoring.fingerprint import Fingerprints
from recovery.state.guards import (
    EVAL_MODE,
    LOADER_AFTER_SAVE,
    SAVE_BEFORE_STEP,
    STEPPED_AFTER_SAVE,
    Caution,
)
from recovery.state.health import WARN, HealthMonitor, UpdateProbe, Verdict
from recovery.state.registry import MODEL, OPTIMIZER, TrainState

log = logging.getLogger(__name__)

HEALTH = "health"
SAMPLER = "sampler"


def _fingerprint(obj: Any) -> Any:
    """What must not change between a save and the next optimizer step, or ``None``."""
    if isinstance(obj, LRScheduler):
        return obj.last_epoch
    if isinstance(obj, torch.amp.GradScaler) and obj.is_enabled():
        return obj.state_dict()
    return None


class Watch:
    """Watches one run's optimizer steps and per-step records: the resume's health, and
    state changed between a save and the next step (the module docstring has the rest).

    Args:
        state: the run's state; a monitor is registered in it as ``health`` when
            ``health`` is enabled and the state has none.
        journal: the run's journal: per-step records are observed, events written.
        health: the monitor's settings (``None``, or ``enabled=False``: no monitor).
        fingerprint: ``checkpoint.resume_check.fingerprint``.
    """

    def __init__(
        self,
        state: TrainState,
        journal: Journal,
        *,
        health: HealthConfig | None,
        fingerprint: str = FINGERPRINT_AUTO,
    ) -> None:
        self.state = state
        self.journal = journal
        self.fingerprints = Fingerprints(state, fingerprint)
        """Which per-step records carry the modules' fingerprint (:mod:`.fingerprint`)."""
        self.monitor: HealthMonitor | None = None
        self.probe: UpdateProbe | None = None
        optimizers = [o for o in state.components.values() if isinstance(o, torch.optim.Optimizer)]
        main = state.components.get(OPTIMIZER)
        main = main if isinstance(main, torch.optim.Optimizer) else next(iter(optimizers), None)
        if health is not None and health.enabled and HEALTH not in state.components:
            model = state.components.get(MODEL)
            world = distributed.current()
            basis = (
                f"sharded:{world.size}:{world.rank}" if sharded.is_sharded(model) else "replicated"
            )
            self.monitor = HealthMonitor(health, basis=basis)
            state.add(HEALTH, self.monitor)
            if isinstance(model, torch.nn.Module):
                self.probe = UpdateProbe(model.parameters(), health.sample)
            elif main is not None:
                params = [p for g in main.param_groups for p in g["params"]]
                self.probe = UpdateProbe(params, health.sample)
        self._main = main
        self._hooks = [o.register_step_pre_hook(self._before_step) for o in optimizers]
        if main is not None:
            self._hooks.append(main.register_step_post_hook(self._after_step))
        self._pending: dict[str, Any] | None = None
        self._saved_step = -1
        self._warned: set[str] = set()
        self._lr_now: float | None = None
        self._measured: dict[str, float] = {}
        self._last_step = 0
        self._start: int | None = None
        self._updates = 0
        self._registered = {id(c) for c in state.components.values()}
        journal.watch(self)
        loaderstarts.watch(self._loader_started)

    def started(self, step: int) -> None:
        """The run begins (fresh or resumed) at ``step``: optimizer steps count from here."""
        self._start, self._updates = step, 0

    # -- optimizer steps ---------------------------------------------------------

    def saved(self, step: int) -> None:
        """A checkpoint of ``step`` was just taken: note what must not change before the
        next optimizer step."""
        self._saved_step = step
        self._check_order(step)
        self._pending = {
            name: mark
            for name, obj in self.state.components.items()
            if (mark := _fingerprint(obj)) is not None
        }

    def _before_step(self, opt: torch.optim.Optimizer, *_: Any) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            for name, before in pending.items():
                now = _fingerprint(self.state.components.get(name))
                if now != before and name not in self._warned:
                    self._warn_changed(name, before, now)
        if opt is self._main:
            self._lr_now = float(opt.param_groups[0]["lr"]) if opt.param_groups else None
            if self.probe is not None:
                self.probe.before()

    def _check_order(self, step: int) -> None:
        if self._main is None or self._start is None or SAVE_BEFORE_STEP in self._warned:
            return
        scalers = [c for c in self.state.components.values() if isinstance(c, torch.amp.GradScaler)]
        if any(s.is_enabled() for s in scalers) or self._updates >= step - self._start:
            return
        self._warned.add(SAVE_BEFORE_STEP)
        self._caution(
            SAVE_BEFORE_STEP,
            OPTIMIZER,
            f"the checkpoint of step {step} was taken after {self._updates} optimizer steps "
            f"since step {self._start}, fewer than {step - self._start}: maybe_save({step}) ran "
            "before optimizer.step() of its step (or between the micro-batches of an "
            f"accumulated step), so it holds step {step - 1}'s parameters labelled {step} and "
            "a resume from it skips an update. Call maybe_save after optimizer.step()",
            step,
        )

    def _loader_started(self, loader: Any) -> None:
        if (
            self._pending is None  # not between a save and the next optimizer step
            or loader.generator is not None
            or id(loader) in self._registered
            or LOADER_AFTER_SAVE in self._warned
        ):
            return
        self._warned.add(LOADER_AFTER_SAVE)
        what = type(loader.dataset).__name__
        self._caution(
            LOADER_AFTER_SAVE,
            what,
            f"a DataLoader over {what} without generator= started after the checkpoint of "
            f"step {self._saved_step} and before the next optimizer step: it drew its seed "
            "from the global torch generator, which the training step draws from too. If "
            f"that is work at the end of step {self._saved_step} (an epoch's test pass after "
            "its last maybe_save), a run resumed from that checkpoint does not run it again "
            "and trains other random numbers from there. Give it its own "
            "generator=torch.Generator().manual_seed(...), or do that work before maybe_save",
            self._saved_step,
        )

    def _caution(self, kind: str, component: str, message: str, step: int) -> None:
        caution = Caution(kind, component, message)
        log.warning("%s", caution.message)
        self.journal.write(caution.record(step=step))

    def _after_step(self, opt: torch.optim.Optimizer, *_: Any) -> None:
        self._updates += 1
        if self._lr_now is not None:
            self._measured["lr"] = self._lr_now
        if self.probe is not None:
            self._measured["update"] = self.probe.after()

    def _warn_changed(self, name: str, before: Any, now: Any) -> None:
        self._warned.add(name)
        what = (
            f"last_epoch {before} -> {now}"
            if isinstance(before, int)
            else "its state changed (scaler.update() after maybe_save?)"
        )
        self._caution(
            STEPPED_AFTER_SAVE,
            name,
            f"{name!r} changed after the checkpoint of step {self._saved_step} was taken and "
            f"before the next optimizer step ({what}): the checkpoint does not hold that "
            "change and a resume from it does not make it again, so the resumed run would "
            "train another schedule. Do that work before the step's maybe_save: an epoch's "
            f"end {name}.step() on the epoch's last batch (if loader.epoch_ended: ...)",
            self._saved_step,
        )

    def evaluate(self, metrics: Callable[[], dict[str, Any]], step: int) -> dict[str, Any]:
        """``metrics()`` at the checkpoint of ``step``, warning once if it changed the
        model's train/eval mode."""
        model = self.state.components.get(MODEL)
        if not isinstance(model, torch.nn.Module):
            return metrics()
        before = model.training
        values = metrics()
        if model.training != before and EVAL_MODE not in self._warned:
            self._warned.add(EVAL_MODE)
            now, back = ("train", "eval") if model.training else ("eval", "train")
            self._caution(
                EVAL_MODE,
                MODEL,
                f"the metrics callable left the model in {now} mode at the checkpoint of step "
                f"{step}: this run goes on training in {now} mode, a run resumed from that "
                f"checkpoint in the mode the model was built in. Call model.{back}() at the "
                "end of the callable",
                step,
            )
        return values

    # -- per-step records (Journal.watch) ----------------------------------------

    def annotate(self, record: dict[str, Any]) -> dict[str, Any]:
        """Fields to add to a per-step record: the last optimizer step's ``lr`` and ``update``
        (with the health monitor), ``batch``: the digest of the example ids the
        registered data position handed out since the previous record, and when due the
        modules' fingerprint (``parameters``, ``buffers``)."""
        measured, self._measured = self._measured, {}
        out = measured if self.monitor is not None else {}
        take = getattr(self.state.components.get(SAMPLER), "take_drawn", None)
        drawn = take() if callable(take) else None
        if drawn is not None:
            out = {**out, "batch": drawn}
        return {**out, **self.fingerprints.fields(int(record["step"]))}

    def observed(self, record: dict[str, Any]) -> None:
        """Feed a written per-step record to the monitor; report a verdict it returns."""
        self._last_step = int(record["step"])
        loss = record.get("loss")
        if self.monitor is None or not isinstance(loss, int | float):
            return
        lr = record.get("lr")
        update = record.get("update")
        self.report(
            self.monitor.observe(
                self._last_step,
                loss=float(loss),
                lr=float(lr) if isinstance(lr, int | float) else 0.0,
                update=float(update) if isinstance(update, int | float) else None,
            )
        )

    def report(self, verdict: Verdict | None) -> None:
        """Log a resume-health verdict (a warning when it departed) and journal it."""
        report(self.journal, self._last_step, verdict)

    def close(self) -> None:
        """Judge a window the run ended inside; stop watching (hooks removed)."""
        if self.monitor is not None:
            self.report(self.monitor.finish())
        self.journal.unwatch(self)
        loaderstarts.unwatch(self._loader_started)
        for hook in self._hooks:
            hook.remove()
        self._hooks = []


def report(journal: Journal, step: int, verdict: Verdict | None) -> None:
    """Log a resume-health verdict (a warning when it departed) and journal it at ``step``."""
    if verdict is None:
        return
    if verdict.status == WARN:
        log.warning("%s", verdict.describe())
    else:
        log.info("%s", verdict.describe())
    journal.write({**verdict.record(), "step": step})
