"""What the two compared loops share: the data, the model, the LR schedule.

Not checkpoint code (nothing here is counted as such): both loops train the same
thing, so their checkpoint code is all that differs.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

N_POINTS = 512
N_FEATURES = 8


class Points(torch.utils.data.Dataset):
    """Fixed random regression points; __getitem__ adds random noise (an augmentation)."""

    def __init__(self, augment: bool = True) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(N_POINTS, N_FEATURES, generator=g)
        self.y = torch.sin(self.x.sum(dim=1, keepdim=True))
        self.augment = augment

    def __len__(self) -> int:
        return N_POINTS

    def __getitem__(self, i: int):
        x = self.x[i]
        if self.augment:  # augmentation draws from the (worker's) global torch RNG
            x = x + 0.1 * torch.randn(N_FEATURES)
        return x, self.y[i], i  # the index is returned only for the step log


def make_model(hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(N_FEATURES, hidden),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(hidden, 1),
    )


def make_schedule(
    optimizer: torch.optim.Optimizer, total: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """Warm-up over 5 steps, then linear decay to 0 at ``total``: a per-step schedule."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / 5) * (1.0 - s / (total + 1))
    )


def step_record(step: int, loss: torch.Tensor, scheduler: object, idx: torch.Tensor,
                x: torch.Tensor) -> dict[str, object]:  # fmt: skip
    """The benchmark's per-step log line: the loss to the bit, the lr, the batch's indices
    and the sum of its augmented inputs (which tells order from augmentation)."""
    return {
        "step": step,
        "loss": loss.item().hex(),
        "lr": scheduler.get_last_lr()[0],  # type: ignore[attr-defined]
        "idx": idx.tolist(),
        "xsum": x.double().sum().item().hex(),
    }


def base_parser(description: str) -> argparse.ArgumentParser:
    """The arguments both loops take (each adds its own diagnostics)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--workdir", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=16)
    return p
