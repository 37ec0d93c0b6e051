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
