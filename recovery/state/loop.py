"""LoopState: the loop's own variables that a resume must restore, as one component.

Real loops carry state outside modules, optimizers and loaders, and leaving it out
trains another run with no error: a batch fetched before the step (a GPT-style loop
that loads the next batch while the GPU works), an RNN's hidden state carried across
bptt chunks, a best validation loss, a learning rate annealed by hand, a patience
counter. Each is a tensor, a Python scalar, or a tuple, list or dict of those.

A :class:`LoopState` holds such variables as attributes, so the loop reads and
rebinds them in place of its locals (``carry.hidden = model(x, carry.hidden)``),
and is registered like any component (``TrainState(..., loop=carry)``). Its state
is the attribute tree, saved pickle-free by the checkpoint's codec (tensors to
safetensors, the rest to JSON with tuples, ints and floats kept as they are) and
restored to the same types and values, each tensor back on the device it was
saved from.

Rejected: registering the tensors themselves. A loop rebinds its variables every
step (``hidden = hidden.detach()``), so a registered object goes stale at once;
the attribute holds whatever the loop bound last.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from recovery.errors import ConfigError

_SCALARS = (bool, int, float, str, type(None))
_NAME = "LoopState"


def _kind(value: Any) -> str:
    return type(value).__name__


def check_value(value: Any, where: str) -> None:
    """Refuse what the pickle-free codec cannot store exactly.

    Raises:
        ConfigError: naming the attribute path, what was found and what is accepted.
    """
    if isinstance(value, (torch.Tensor, *_SCALARS)):
        return
    if isinstance(value, tuple | list):
        for i, item in enumerate(value):
            check_value(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str | int):
                raise ConfigError(
                    f"{_NAME}.{where}: a dict key {key!r} ({_kind(key)}); keys must be str or int"
                )
            check_value(item, f"{where}[{key!r}]")
        return
    raise ConfigError(
        f"{_NAME}.{where}: a {_kind(value)} cannot be saved without pickle; hold tensors, "
        "bool/int/float/str/None, or tuples, lists and dicts of them (an object with "
        "state_dict()/load_state_dict() is registered as a component of its own)"
    )


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of a value, in a fixed order (depth first, dicts in key order)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, tuple | list):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _placed(value: Any, devices: Iterator[str]) -> Any:
    """``value`` with each tensor copied to its device, in :func:`_tensors` order."""
    if isinstance(value, torch.Tensor):
        return value.to(next(devices), copy=True)
    if isinstance(value, tuple):
        return tuple(_placed(v, devices) for v in value)
    if isinstance(value, list):
        return [_placed(v, devices) for v in value]
    if isinstance(value, dict):
        return {k: _placed(v, devices) for k, v in value.items()}
    return value


class LoopState:
    """The loop's own variables, saved and restored with the run.

    Args:
        **values: name -> initial value (a tensor, ``bool``/``int``/``float``/``str``/
            ``None``, or tuples, lists and dicts of them). Read and rebind them as
            attributes; new attributes may be added before the run restores.

    Raises:
        ConfigError: a value the pickle-free codec cannot store (at construction, and
            at each save for what was bound since), or a name starting with ``_``.

    Example::

        carry = LoopState(batch=None, hidden=None)
        state = TrainState(model=model, optimizer=opt, loop=carry)
        step = ckpt.restore(state, "latest")
        if carry.batch is None:
            carry.batch = next_batch()
    """

    def __init__(self, **values: Any) -> None:
        for name, value in values.items():
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            raise ConfigError(f"{_NAME}: {name!r}: names starting with '_' are reserved")
        check_value(value, name)
        super().__setattr__(name, value)

    def __repr__(self) -> str:
        return f"{_NAME}({', '.join(sorted(vars(self)))})"

    def state_dict(self) -> dict[str, Any]:
        """The variables as they are bound now, and the device of each tensor.

        Raises:
            ConfigError: a variable was bound to a value that cannot be saved.
        """
        values = dict(vars(self))
        for name, value in values.items():
            check_value(value, name)
        devices = [str(t.device) for t in _tensors(values)]
        return {"values": values, "devices": devices}

    def check_state_dict(self, state: Any) -> list[str]:
        """Why ``state`` cannot be restored here: other variable names than this loop's."""
        if not isinstance(state, dict) or not isinstance(state.get("values"), dict):
            return [f"loop state: checkpoint holds {_kind(state)}, not a {_NAME}'s state"]
        problems = []
        saved, live = set(state["values"]), set(vars(self))
        if saved != live:
            problems.append(
                f"loop state: checkpoint holds {sorted(saved)}, this loop {sorted(live)} "
                f"(missing here: {sorted(saved - live)}; not in the checkpoint: "
                f"{sorted(live - saved)})"
            )
        for device in {str(d) for d in state.get("devices") or []}:
            try:
                torch.empty(0, device=device)
            except (RuntimeError, AssertionError) as err:
                problems.append(f"loop state: a tensor was saved on {device}, absent here ({err})")
        return problems

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Bind every variable to its saved value (tensors copied onto their saved devices)."""
        devices = iter(state.get("devices") or [])
        for name, value in state["values"].items():
            count = sum(1 for _ in _tensors(value))
            wanted = [next(devices, "cpu") for _ in range(count)]
            setattr(self, name, _placed(value, iter(wanted)))
