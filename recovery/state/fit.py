"""Does a saved state fit the live objects? The checks run before anything is loaded.

:class:`~recovery.state.registry.TrainState` calls them for every component
before it applies any, so a refused load changes nothing; :func:`owned` gives
what is loaded memory of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


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


PARAM, FLAT_GROUP, FLAT_PARAM, ROW, COLUMN = (
    "the parameter's shape",
    "one flat vector over the group's parameters",
    "the parameter flattened",
    "the row factor",
    "the column factor",
)
"""The layouts in which optimizers keep a tensor of a parameter's state."""
LAYOUTS: dict[str, dict[str, tuple[str, ...]]] = {
    # L-BFGS keeps its directions and gradients flat over every parameter of its one
    # group, under the first parameter's state (torch.optim.LBFGS)
    "LBFGS": {k: (FLAT_GROUP,) for k in ("d", "prev_flat_grad", "old_dirs", "old_stps")},
    # Adafactor factors a matrix's second moment into a row and a column vector
    "Adafactor": {"row_var": (ROW,), "col_var": (COLUMN,)},
}
"""What an optimizer class writes where it is not the parameter's shape, by state key; any
other key of a class named here is per parameter, and so is every key of torch's other
optimizers. Any other class (not derived from one of torch's) may use any of the layouts:
a ZeRO-style shard, another library's factoring."""
ANY = (PARAM, FLAT_GROUP, FLAT_PARAM, ROW, COLUMN)


def layouts(optimizer: torch.optim.Optimizer, key: str) -> tuple[str, ...]:
    """The layouts ``optimizer``'s class writes for state ``key`` (:data:`LAYOUTS`); torch's
    own other optimizers keep every tensor per parameter."""
    for cls in type(optimizer).__mro__:
        if cls.__name__ in LAYOUTS:
            return LAYOUTS[cls.__name__].get(key, (PARAM,))
        if cls is not torch.optim.Optimizer and cls.__module__.startswith("torch.optim."):
            return (PARAM,)
    return ANY


def shape_of(layout: str, param: tuple[int, ...], group_numel: int) -> tuple[int, ...] | None:
    """The shape a tensor of ``layout`` has for a parameter of shape ``param`` (``None``:
    the layout does not apply, a factor of a vector)."""
    numel = 1
    for n in param:
        numel *= n
    if layout == PARAM:
        return param
    if layout == FLAT_GROUP:
        return (group_numel,)
    if layout == FLAT_PARAM:
        return (numel,)
    if len(param) < 2:
        return None
    return (*param[:-1], 1) if layout == ROW else (*param[:-2], 1, param[-1])


def optimizer_mismatches(saved: Any, live: torch.optim.Optimizer) -> list[str]:
    """Differences that would make ``Optimizer.load_state_dict`` fail or mis-assign state:
    the groups and their sizes, and every state tensor's shape against what ``live``'s
    class writes for that key (:func:`layouts`: per parameter, flat over the group for
    L-BFGS, factored for Adafactor); a list of tensors (L-BFGS's history) element by element."""
    if not isinstance(saved, Mapping) or "param_groups" not in saved or "state" not in saved:
        return ["optimizer: checkpoint entry is not an optimizer state_dict"]
    groups_saved = saved["param_groups"]
    groups_live = live.param_groups
    if len(groups_saved) != len(groups_live):
        return [
            f"optimizer: {len(groups_saved)} param groups in checkpoint, {len(groups_live)} now"
        ]
    problems: list[str] = []
    shapes: dict[int, tuple[tuple[int, ...], int]] = {}
    for g, (gs, gl) in enumerate(zip(groups_saved, groups_live, strict=True)):
        if len(gs["params"]) != len(gl["params"]):
            problems.append(
                f"optimizer group {g}: {len(gs['params'])} params in checkpoint, "
                f"{len(gl['params'])} now"
            )
            continue
        group_numel = sum(p.numel() for p in gl["params"])
        for pid, param in zip(gs["params"], gl["params"], strict=True):
            shapes[pid] = (tuple(param.shape), group_numel)
    kind = type(live).__name__
    for pid, entry in saved["state"].items():
        if pid not in shapes:
            continue
        param, group_numel = shapes[pid]
        for name, value in entry.items():
            allowed = layouts(live, name)
            wanted = {s for la in allowed if (s := shape_of(la, param, group_numel)) is not None}
            values = value if isinstance(value, list | tuple) else [value]
            for t in values:
                if isinstance(t, torch.Tensor) and t.dim() > 0 and tuple(t.shape) not in wanted:
                    problems.append(
                        f"optimizer state {pid}.{name}: shape {tuple(t.shape)}, expected "
                        f"{' or '.join(str(w) for w in sorted(wanted))} ({' or '.join(allowed)}, "
                        f"as {kind} keeps it) for a parameter of shape {param}"
                    )
                    break
    return problems
