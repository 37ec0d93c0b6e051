"""TrainState: the registry of everything a resume must restore, together.

A run registers its pieces by name (``model``, ``optimizer``, ``scheduler``,
``sampler``, ``scaler`` and any user object with ``state_dict`` and
``load_state_dict``); the RNG streams are always included under ``rng``.
:meth:`TrainState.state_dict` takes all of them at one instant, the step
boundary. :meth:`TrainState.load_state_dict` checks every piece against the
live objects first and only then applies them, so a refused load changes
nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from recovery.errors import ConfigError, IncompatibleStateError
from recovery.state import rng, wrapping

log = logging.getLogger(__name__)

DROP_ENV = "RECOVERY_DRILL_DROP"
OPTIONAL = frozenset({"health"})
"""Diagnostic components a checkpoint may lack, or hold while the run does not register
them (the resume health history): never part of the training trajectory, so a
mismatch in them must not stop a resume."""
MODEL = "model"
OPTIMIZER = "optimizer"
RNG = "rng"


@runtime_checkable
class Stateful(Protocol):
    """Anything whose state can be taken and put back.

    A component may also define ``check_state_dict(state) -> list[str]``,
    returning why ``state`` cannot be loaded; :class:`TrainState` calls it
    for every component before loading any, so a refusal changes nothing.
    """

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


def owned(value: Any) -> Any:
    """``value`` with every tensor replaced by a contiguous copy in its own memory.

    Decoded tensors are views into one buffer per file (zero-copy decoding); code
    that keeps a tensor it was given, or hands it to C++ that expects its own
    storage (``torch.Generator.set_state`` on a torchdata loader's state), must get
    a tensor that owns its memory.
    """
    if isinstance(value, torch.Tensor):
        return value.clone(memory_format=torch.contiguous_format)
    if isinstance(value, Mapping):
        return {k: owned(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(owned(v) for v in value)
    return value


def model_mismatches(saved: Mapping[str, Any], live: Mapping[str, torch.Tensor]) -> list[str]:
    """Every difference between a saved model state and the live model's.

    Returns one line per missing key, unexpected key, shape or dtype difference.
    """
    problems = [
        f"missing in checkpoint: {k} {tuple(live[k].shape)}" for k in live if k not in saved
    ]
    problems += [f"not in this model: {k}" for k in saved if k not in live]
    for key in live:
        if key not in saved:
            continue
        old, new = saved[key], live[key]
        if not isinstance(old, torch.Tensor):
            problems.append(f"{key}: checkpoint holds a {type(old).__name__}, not a tensor")
        elif tuple(old.shape) != tuple(new.shape):
            problems.append(
                f"{key}: checkpoint shape {tuple(old.shape)}, model shape {tuple(new.shape)}"
            )
        elif old.dtype != new.dtype:
            problems.append(f"{key}: checkpoint dtype {old.dtype}, model dtype {new.dtype}")
    return problems


def optimizer_mismatches(saved: Any, live: torch.optim.Optimizer) -> list[str]:
    """Differences that would make ``Optimizer.load_state_dict`` fail or mis-assign moments."""
    if not isinstance(saved, Mapping) or "param_groups" not in saved or "state" not in saved:
        return ["optimizer: checkpoint entry is not an optimizer state_dict"]
    groups_saved = saved["param_groups"]
    groups_live = live.param_groups
    if len(groups_saved) != len(groups_live):
        return [
            f"optimizer: {len(groups_saved)} param groups in checkpoint, {len(groups_live)} now"
        ]
    problems: list[str] = []
    shapes: dict[int, tuple[int, ...]] = {}
    for g, (gs, gl) in enumerate(zip(groups_saved, groups_live, strict=True)):
        if len(gs["params"]) != len(gl["params"]):
            problems.append(
                f"optimizer group {g}: {len(gs['params'])} params in checkpoint, "
                f"{len(gl['params'])} now"
            )
            continue
        for pid, param in zip(gs["params"], gl["params"], strict=True):
            shapes[pid] = tuple(param.shape)
    for pid, entry in saved["state"].items():
        for name, value in entry.items():
            if (
                isinstance(value, torch.Tensor)
                and value.dim() > 0
                and pid in shapes
                and tuple(value.shape) != shapes[pid]
            ):
                problems.append(
                    f"optimizer state {pid}.{name}: shape {tuple(value.shape)}, "
                    f"param shape {shapes[pid]}"
                )
    return problems


class TrainState:
    """Named stateful pieces of one run, saved and restored as one.

    Args:
        **components: name -> object with ``state_dict``/``load_state_dict``.
            ``model`` must be a ``torch.nn.Module`` if given; ``optimizer`` a
            ``torch.optim.Optimizer``. ``rng`` is reserved.
    """

    def __init__(self, **components: Any) -> None:
        if RNG in components:
            raise ConfigError("TrainState: 'rng' is reserved; RNG streams are always captured")
        for name, obj in components.items():
            if obj is None:
                continue
            if not isinstance(obj, Stateful):
                raise ConfigError(
                    f"TrainState: component '{name}' ({type(obj).__name__}) has no "
                    "state_dict/load_state_dict; wrap it or leave it out"
                )
        self.components: dict[str, Any] = {k: v for k, v in components.items() if v is not None}

    def add(self, name: str, obj: Any) -> None:
        """Register one more component (before the run restores or saves)."""
        if name == RNG or name in self.components:
            raise ConfigError(f"TrainState: component '{name}' is already registered")
        if not isinstance(obj, Stateful):
            raise ConfigError(
                f"TrainState: component '{name}' ({type(obj).__name__}) has no "
                "state_dict/load_state_dict"
            )
        self.components[name] = obj

    @property
    def names(self) -> list[str]:
        """Component names in save order, ``rng`` last."""
        return [*self.components, RNG]

    def state_dict(self) -> dict[str, Any]:
        """Take every component's state and the RNG streams, now."""
        tree = {
            name: wrapping.canonical(obj.state_dict())
            if isinstance(obj, torch.nn.Module)
            else obj.state_dict()
            for name, obj in self.components.items()
        }
        tree[RNG] = rng.capture()
        return tree

    def expectations(self, step: int) -> dict[str, Any]:
        """What the run is about to do after ``step``: its learning rates and next batch.

        Recorded in each checkpoint so a preflight can check that restoring it
        reproduces them.
        """
        out: dict[str, Any] = {"step": step}
        opt = self.components.get(OPTIMIZER)
        if isinstance(opt, torch.optim.Optimizer):
            out["lr"] = [float(g["lr"]) for g in opt.param_groups]
        peek = getattr(self.components.get("sampler"), "peek", None)
        if callable(peek):
            out["next_batch"] = [int(i) for i in peek()]
        return out

    def mismatches(self, tree: Mapping[str, Any], only: list[str] | None = None) -> list[str]:
        """Every reason ``tree`` cannot be loaded into this state, empty if it can.

        Args:
            tree: component name -> state.
            only: check just these components (a partial load); default all, and
                the component sets must then match exactly.
        """
        wanted = only if only is not None else self.names
        problems = [
            f"component '{n}' is not in the checkpoint"
            for n in wanted
            if n not in tree and n not in OPTIONAL
        ]
        if only is None:
            problems += [
                f"checkpoint has component '{n}', which this run does not register"
                for n in tree
                if n not in self.names and n not in OPTIONAL
            ]
        else:
            tree = {k: v for k, v in tree.items() if k in only}
        model = self.components.get(MODEL)
        if isinstance(model, torch.nn.Module) and MODEL in tree:
            live = model.state_dict()
            problems += model_mismatches(wrapping.to_live(tree[MODEL], live), live)
        opt = self.components.get(OPTIMIZER)
        if isinstance(opt, torch.optim.Optimizer) and OPTIMIZER in tree:
            problems += optimizer_mismatches(tree[OPTIMIZER], opt)
        for name, obj in self.components.items():
            check = getattr(obj, "check_state_dict", None)
            if callable(check) and name in tree:
                problems += list(check(tree[name]))
        if RNG in tree:
            problems += rng.validate(tree[RNG])
        return problems

    def load_state_dict(
        self, tree: Mapping[str, Any], *, source: str = "checkpoint", only: list[str] | None = None
    ) -> None:
        """Restore every component (or just ``only``) and the RNG streams from ``tree``.

        Everything is checked before anything is applied.

        Raises:
            IncompatibleStateError: listing every mismatch; nothing was changed.
        """
        problems = self.mismatches(tree, only)
        if problems:
            raise IncompatibleStateError(
                f"{source} does not fit this run ({len(problems)} mismatches):\n  "
                + "\n  ".join(problems)
                + "\nResume it with the model and config that wrote it, or start a new run.",
                mismatches=problems,
                path=source if source != "checkpoint" else None,
            )
        # Test-only: a drill must be able to fail. RECOVERY_DRILL_DROP=<component> makes
        # a resume skip restoring that piece (sampler, optimizer, rng, ...), so a drill
        # can show it catches the difference. Never set it outside such a test.
        dropped = os.environ.get(DROP_ENV, "")
        if dropped:
            log.warning("%s=%s: NOT restoring %s (drill failure test)", DROP_ENV, dropped, dropped)
        for name, obj in self.components.items():
            if (only is None or name in only) and name != dropped and name in tree:
                # a module copies into its own parameters; anything else may keep what it
                # is handed, which must then not be a view into the checkpoint's file buffer
                value = (
                    wrapping.to_live(tree[name], obj.state_dict())
                    if isinstance(obj, torch.nn.Module)
                    else owned(tree[name])
                )
                obj.load_state_dict(value)
        if (only is None or RNG in only) and dropped != RNG:
            rng.restore(owned(tree[RNG]))
