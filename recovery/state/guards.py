"""Wiring that makes a resumed run differ silently from the run that died, found at registration.

Each guard inspects the registered components (never their data) and returns a
:class:`Caution`: the registry logs it as a warning, and the checkpointer
records it in the journal (``{"event": "warning", ...}``) when the run starts.
What cannot work at all is refused instead (:func:`refuse`): a plain
``DataLoader`` or sampler has no position to save.

Guarded here:

- a ``DataLoader`` (or subclass, e.g. torchdata's ``StatefulDataLoader``) with
  ``generator=None``: every iterator it starts draws its workers' base seed
  (and, shuffling, its order) from the global torch RNG, and a resumed run
  starts one mid-epoch where the original did not, so the training RNG stream
  (dropout, noise) shifts from the resume on; the same for a ``RandomSampler``
  without a generator inside it;
- an optimizer with an LR scheduler attached (torch's ``LRScheduler`` wraps
  ``optimizer.step`` and marks the wrapper ``_wrapped_by_lr_sched``) that is not
  registered: the resume would restart its schedule; and a registered
  scheduler driving an optimizer that is not registered;
- an optimizer that updates none of the registered modules' parameters (its
  moments would be restored onto parameters no model has); a second model
  registered beside its own optimizer (a GAN's) is as documented.

A scheduler stepped after the save (an epoch-end ``scheduler.step()`` after
``maybe_save``) can only be seen while the run trains:
:mod:`recovery.run.monitoring.watch`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import DataLoader, RandomSampler, Sampler

from recovery.errors import ConfigError

LOADER_GENERATOR = "loader_generator"
UNREGISTERED_SCHEDULER = "unregistered_scheduler"
FOREIGN_OPTIMIZER = "foreign_optimizer"
STEPPED_AFTER_SAVE = "stepped_after_save"
EVAL_MODE = "eval_mode_after_metrics"
SAVE_BEFORE_STEP = "save_before_step"
LOADER_AFTER_SAVE = "loader_after_save"


@dataclass(frozen=True)
class Caution:
    """One wiring problem that would make a resume differ silently.

    Attributes:
        kind: what was found (``loader_generator``, ``unregistered_scheduler``, ...).
        component: the registered component it is about.
        message: what happens and how to fix it.
    """

    kind: str
    component: str
    message: str

    def record(self, **extra: Any) -> dict[str, Any]:
        """The journal's ``warning`` event."""
        return {
            "event": "warning",
            "kind": self.kind,
            "component": self.component,
            "message": self.message,
            **extra,
        }


def refuse(name: str, obj: Any) -> None:
    """Refuse a data pipeline whose position cannot be saved, saying what to use instead.

    Raises:
        ConfigError: ``obj`` is a torch ``DataLoader`` or ``Sampler`` without
            ``state_dict``/``load_state_dict``.
    """
    stateful = callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )
    if stateful:
        return
    if isinstance(obj, DataLoader):
        raise ConfigError(
            f"TrainState: component {name!r} is a torch DataLoader, whose position (epoch, "
            "offset, order) cannot be saved, so a resume would restart its epoch. Use "
            "recovery.ResumableLoader(dataset, batch_size=..., seed=..., ...) "
            "(ResumableLoader.from_loader(loader) keeps its settings) or torchdata's "
            "StatefulDataLoader, and register that"
        )
    if isinstance(obj, Sampler):
        raise ConfigError(
            f"TrainState: component {name!r} is a torch {type(obj).__name__}, whose position "
            "cannot be saved. Use recovery.ResumableSampler(num_examples, batch_size, seed) "
            "or recovery.ResumableLoader(dataset, batch_size=..., seed=...)"
        )


def _loader(name: str, loader: DataLoader[Any]) -> list[Caution]:
    kind = type(loader).__name__
    if loader.generator is None:
        return [
            Caution(
                LOADER_GENERATOR,
                name,
                f"component {name!r} ({kind}) has no generator=: each iterator it starts "
                "draws its workers' base seed (and, shuffling, its order) from the global "
                "torch RNG, and a resumed run starts one mid-epoch, so the training RNG "
                "stream (dropout, noise) differs from the resume on. Pass "
                "generator=torch.Generator().manual_seed(seed) to the loader",
            )
        ]
    samplers = [loader.sampler, getattr(loader.batch_sampler, "sampler", None)]
    if any(isinstance(s, RandomSampler) and s.generator is None for s in samplers):
        return [
            Caution(
                LOADER_GENERATOR,
                name,
                f"component {name!r} ({kind}) shuffles with a RandomSampler that has no "
                "generator=: its order is drawn from the global torch RNG each epoch, so a "
                "resumed run's order and RNG stream differ. Pass shuffle=True and the "
                "loader's generator= instead of sampler=, or give the sampler a generator",
            )
        ]
    return []


def _wrapped_by_scheduler(opt: torch.optim.Optimizer) -> bool:
    # LRScheduler.__init__ replaces the instance's step with a wrapper carrying this flag
    # (torch/optim/lr_scheduler.py, patch_track_step_called); ReduceLROnPlateau does not
    return bool(getattr(opt.__dict__.get("step"), "_wrapped_by_lr_sched", False))


def _schedules(components: Mapping[str, Any], absent: Mapping[str, str]) -> list[Caution]:
    optimizers = {n: o for n, o in components.items() if isinstance(o, torch.optim.Optimizer)}
    schedulers = {n: s for n, s in components.items() if isinstance(s, LRScheduler)}
    driven = {id(s.optimizer) for s in schedulers.values()}
    out: list[Caution] = []
    for name, opt in optimizers.items():
        if _wrapped_by_scheduler(opt) and id(opt) not in driven:
            why = (
                f" (the state declares 'scheduler' absent: {absent['scheduler']})"
                if ("scheduler" in absent)
                else ""
            )
            out.append(
                Caution(
                    UNREGISTERED_SCHEDULER,
                    name,
                    f"optimizer {name!r} has an LR scheduler attached that is not "
                    f"registered{why}: a resume would restart its schedule from the start. "
                    "Register it: TrainState(..., scheduler=sched)",
                )
            )
    mine = {id(o) for o in optimizers.values()}
    for name, sched in schedulers.items():
        if optimizers and id(sched.optimizer) not in mine:
            out.append(
                Caution(
                    FOREIGN_OPTIMIZER,
                    name,
                    f"scheduler {name!r} drives an optimizer that is not registered: its "
                    "learning rates would be restored onto nothing. Register that optimizer",
                )
            )
    return out


def _optimizer_over_model(components: Mapping[str, Any]) -> list[Caution]:
    # every registered module counts: a second model registered beside its own optimizer
    # (a GAN's netD and optimizerD) is as documented, not a foreign optimizer
    modules = [m for m in components.values() if isinstance(m, torch.nn.Module)]
    if not isinstance(components.get("model"), torch.nn.Module):
        return []
    params = {id(p) for m in modules for p in m.parameters()}
    return [
        Caution(
            FOREIGN_OPTIMIZER,
            name,
            f"optimizer {name!r} updates none of the registered models' parameters (was it "
            "built for another model, or before the model was replaced?): its restored "
            "state would not belong to a model that trains",
        )
        for name, opt in components.items()
        if isinstance(opt, torch.optim.Optimizer)
        and params
        and not any(id(p) in params for g in opt.param_groups for p in g["params"])
    ]


def cautions(components: Mapping[str, Any], absent: Mapping[str, str]) -> list[Caution]:
    """Every :class:`Caution` the registered ``components`` call for, in a stable order."""
    out: list[Caution] = []
    for name, obj in components.items():
        if isinstance(obj, DataLoader):
            out += _loader(name, obj)
    return out + _schedules(components, absent) + _optimizer_over_model(components)
