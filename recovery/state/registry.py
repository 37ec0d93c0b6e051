"""TrainState: the registry of everything a resume must restore, together.

A run registers its pieces by name (``model``, ``optimizer``, ``scheduler``,
``sampler``, ``scaler`` and any user object with ``state_dict`` and
``load_state_dict``); the RNG streams are always included under ``rng``.
:meth:`TrainState.state_dict` takes all of them at one instant, the step
boundary. :meth:`TrainState.load_state_dict` checks every piece against the
live objects first and only then applies them, so a refused load changes
nothing.

A loop that has no scheduler or no data position declares so, with a reason
(``absent=``, :mod:`recovery.state.declared`); wiring that would make a resume
differ silently is warned about at registration (:mod:`recovery.state.guards`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from recovery.errors import ConfigError, IncompatibleStateError
from recovery.state import adapters, declared, guards, rng, wrapping
from recovery.state.fit import model_mismatches, optimizer_mismatches, owned
from recovery.state.guards import Caution

log = logging.getLogger(__name__)

DROP_ENV = "RECOVERY_DRILL_DROP"
OPTIONAL = frozenset({"health"})
"""Diagnostic components a checkpoint may lack, or hold while the run does not register
them (the resume health history): never part of the training trajectory, so a
mismatch in them must not stop a resume."""
MODEL = "model"
OPTIMIZER = "optimizer"
RNG = "rng"
ABSENT = "absent"


@runtime_checkable
class Stateful(Protocol):
    """Anything whose state can be taken and put back.

    A component may also define ``check_state_dict(state) -> list[str]``,
    returning why ``state`` cannot be loaded; :class:`TrainState` calls it
    for every component before loading any, so a refusal changes nothing.
    """

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


class TrainState:
    """Named stateful pieces of one run, saved and restored as one.

    Args:
        absent: pieces the loop does not have, name -> why (``{"scheduler": "lr is a
            function of the step", "sampler": "batches are drawn from the rng"}``):
            recorded, signed, in every checkpoint, accepted by the continuation
            contract instead of the component, and checked on resume.
        **components: name -> object with ``state_dict``/``load_state_dict`` (a
            ``torch.Generator`` is registered as its stream). ``model`` must be a
            ``torch.nn.Module`` if given; ``optimizer`` a ``torch.optim.Optimizer``.
            ``rng`` and ``absent`` are reserved.

    Raises:
        ConfigError: a component without ``state_dict``/``load_state_dict`` (a plain
            ``DataLoader`` or sampler: with what to use instead), ``rng``, or a
            declaration :func:`recovery.state.declared.validate` refuses.
    """

    def __init__(self, *, absent: Mapping[str, str] | None = None, **components: Any) -> None:
        if RNG in components:
            raise ConfigError("TrainState: 'rng' is reserved; RNG streams are always captured")
        self.components: dict[str, Any] = {}
        for name, obj in components.items():
            if obj is not None:
                self.components[name] = _checked(name, obj)
        self.absent: dict[str, str] = declared.validate(absent or {}, self.components)
        """What the loop declares it does not have, name -> reason."""
        self.cautions: list[Caution] = []
        """Wiring that would make a resume differ silently (logged once each)."""
        self.review()

    def add(self, name: str, obj: Any) -> None:
        """Register one more component (before the run restores or saves).

        Raises:
            ConfigError: the name is taken or declared absent, or ``obj`` is not stateful.
        """
        if name == RNG or name in self.components:
            raise ConfigError(f"TrainState: component '{name}' is already registered")
        if name in self.absent:
            raise ConfigError(f"TrainState: component '{name}' is declared absent")
        self.components[name] = _checked(name, obj)
        self.review()

    def declare(self, name: str, reason: str) -> None:
        """Declare that the loop has no ``name`` and why (as ``absent=`` does)."""
        self.absent.update(declared.validate({name: reason}, self.components))
        self.review()

    def review(self) -> list[Caution]:
        """Run the registration guards again (objects may have been wired since); log each
        new :class:`~recovery.state.guards.Caution` once. Returns all of them."""
        for caution in guards.cautions(self.components, self.absent):
            if caution not in self.cautions:
                self.cautions.append(caution)
                log.warning("%s", caution.message)
        return list(self.cautions)

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

    def mismatches(
        self,
        tree: Mapping[str, Any],
        only: list[str] | None = None,
        *,
        absent: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Every reason ``tree`` cannot be loaded into this state, empty if it can.

        Args:
            tree: component name -> state.
            only: check just these components (a partial load); default all, and
                the component sets must then match exactly, declared absences
                included (:func:`recovery.state.declared.mismatches`).
            absent: what the checkpoint declares absent (its signed ``absent``).
        """
        wanted = only if only is not None else self.names
        spoken = declared.involved(absent or {}, self.absent) if only is None else set()
        problems = [
            f"component '{n}' is not in the checkpoint"
            for n in wanted
            if n not in tree and n not in OPTIONAL and n not in spoken
        ]
        if only is None:
            problems += self.absence_mismatches(absent or {}, tree)
            problems += [
                f"checkpoint has component '{n}', which this run does not register"
                for n in tree
                if n not in self.names and n not in OPTIONAL and n not in spoken
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

    def absence_mismatches(self, absent: Mapping[str, str], saved: Iterable[str]) -> list[str]:
        """Where a checkpoint holding ``saved`` and declaring ``absent`` disagrees with this
        state's components and declarations (:func:`recovery.state.declared.mismatches`)."""
        return declared.mismatches(absent, saved, self.absent, self.components)

    def load_state_dict(
        self,
        tree: Mapping[str, Any],
        *,
        source: str = "checkpoint",
        only: list[str] | None = None,
        absent: Mapping[str, str] | None = None,
    ) -> list[str]:
        """Restore every component (or just ``only``) and the RNG streams from ``tree``.

        Everything is checked before anything is applied (``absent``: the checkpoint's
        declarations, see :meth:`mismatches`).

        Returns:
            The components restored, in save order (``rng`` last).

        Raises:
            IncompatibleStateError: listing every mismatch; nothing was changed.
        """
        problems = self.mismatches(tree, only, absent=absent)
        if problems:
            raise IncompatibleStateError(
                does_not_fit(source, problems)
                + ". Resume it with the model and config that wrote it, or start a new run.",
                mismatches=problems,
                path=source if source != "checkpoint" else None,
            )
        # Test-only: a drill must be able to fail. RECOVERY_DRILL_DROP=<component> makes
        # a resume skip restoring that piece (sampler, optimizer, rng, ...), so a drill
        # can show it catches the difference. Never set it outside such a test.
        dropped = os.environ.get(DROP_ENV, "")
        if dropped:
            log.warning("%s=%s: NOT restoring %s (drill failure test)", DROP_ENV, dropped, dropped)
        restored: list[str] = []
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
                restored.append(name)
        if (only is None or RNG in only) and dropped != RNG:
            rng.restore(owned(tree[RNG]))
            restored.append(RNG)
        return restored


def _checked(name: str, obj: Any) -> Any:
    """``obj`` as a component (:func:`recovery.state.adapters.adapt`), once it is stateful.

    Raises:
        ConfigError: it is not (a plain ``DataLoader`` or sampler: with what to use instead).
    """
    if name == ABSENT:
        raise ConfigError("TrainState: 'absent' is reserved for declarations of absence")
    obj = adapters.adapt(obj)
    guards.refuse(name, obj)
    if not isinstance(obj, Stateful):
        raise ConfigError(
            f"TrainState: component '{name}' ({type(obj).__name__}) has no "
            "state_dict/load_state_dict; wrap it or leave it out"
        )
    return obj


def does_not_fit(source: object, problems: list[str]) -> str:
    """``<source> does not fit this run (N mismatches): a; b; c``: one line that names every
    mismatch (a one-line error shows them all; an own loop prints only the first line)."""
    count = f"{len(problems)} mismatch" + ("" if len(problems) == 1 else "es")
    return f"{source} does not fit this run ({count}): " + "; ".join(problems)
