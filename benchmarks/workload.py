"""The benchmarks' state: a transformer-shaped model and Adam's moments, and its helpers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

WIDTH = 1024  # the layers' width at the sizes BENCHMARKS.md reports (0.25 GiB and up)


def layer_params(d: int) -> int:
    """The parameters of one ``d``-wide layer (attention, MLP, two layer norms)."""
    return 3 * d * d + 3 * d + d * d + d + 4 * d * d + 4 * d + 4 * d * d + d + 4 * d


def make_state(size_gb: float, *, fill: bool = True) -> dict[str, Any]:
    """A model state_dict and an Adam state_dict, ~``size_gb`` GiB together (3 x params).

    With ``fill=False`` the tensors are left uninitialised (a load target).
    """
    # 1024 wide, as many layers as the size holds; a size below one such layer (the
    # tests' smoke runs) gets one layer made narrower instead of a layer 16 times too big
    budget = size_gb * (1 << 30) / 4 / 3
    d = WIDTH
    while d > 64 and layer_params(d) + 2048 * d > budget:
        d //= 2
    per_layer = layer_params(d)
    layers = max(1, round(budget / per_layer))
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) if fill else torch.empty(*shape)

    def like(t: torch.Tensor) -> torch.Tensor:
        return torch.randn_like(t) if fill else torch.empty_like(t)

    model: dict[str, torch.Tensor] = {"embed.weight": randn(2048, d)}
    for i in range(layers):
        p = f"layers.{i}."
        model |= {
            p + "attn.qkv.weight": randn(3 * d, d),
            p + "attn.qkv.bias": randn(3 * d),
            p + "attn.out.weight": randn(d, d),
            p + "attn.out.bias": randn(d),
            p + "mlp.fc1.weight": randn(4 * d, d),
            p + "mlp.fc1.bias": randn(4 * d),
            p + "mlp.fc2.weight": randn(d, 4 * d),
            p + "mlp.fc2.bias": randn(d),
            p + "ln1.weight": torch.ones(d),
            p + "ln1.bias": torch.zeros(d),
            p + "ln2.weight": torch.ones(d),
            p + "ln2.bias": torch.zeros(d),
        }
    state = {
        i: {"step": torch.tensor(100.0), "exp_avg": like(t), "exp_avg_sq": like(t).abs_()}
        for i, t in enumerate(model.values())
    }
    groups = [
        {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "params": list(state)}
    ]
    return {"model": model, "optimizer": {"state": state, "param_groups": groups}}


def flat(tree: dict[str, Any]) -> dict[str, torch.Tensor]:
    out = dict(tree["model"])
    for i, s in tree["optimizer"]["state"].items():
        for k, v in s.items():
            out[f"opt.{i}.{k}"] = v
    return out


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def fsync_tree(path: Path) -> None:
    for f in [path] if path.is_file() else sorted(path.rglob("*")):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def tensors_only(tree: dict[str, Any]) -> dict[str, Any]:
    """The optimizer state as DCP stores it (nested dicts of tensors; groups as plain values)."""
    return {str(i): s for i, s in tree["optimizer"]["state"].items()}
