"""What the modules' fingerprint costs, against the training step it is recorded after.

    python benchmarks/bench_fingerprint.py [--runs 5] [--size-gb 1.0] [--json OUT]

For each model: the recipes' two (the embedding recipe's ``DotProduct`` at its default
sizes, batch 256, Adam; the classifier recipe's ``CNN``, batch 64 of 8x8 digits,
Adam) and a transformer-shaped model of ``--size-gb`` of fp32 parameters (the layers
of ``bench_checkpoint.py``, Adam, one batch of 8 rows): the median of ``--runs``
training steps (forward, backward, ``optimizer.step()``) and of as many fingerprints
(:func:`recovery.run.monitoring.fingerprint.fingerprint`, after one untimed of each),
the fingerprint's cost as a share of one step, and the ``K`` that
``checkpoint.resume_check.fingerprint=auto`` takes from them (the smallest power of two
that keeps it under 1 % of the steps it covers; none past 1024 steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from recipes.classifier import CNN  # noqa: E402
from recipes.embedding import DotProduct  # noqa: E402
from recovery.run.monitoring import fingerprint as fp  # noqa: E402


def embedding() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = DotProduct(2000, 1000, 32, 0.1)
    users, items = torch.randint(2000, (256,)), torch.randint(1000, (256,))
    target = torch.rand(256)
    return model, lambda: nn.functional.mse_loss(model(users, items), target)


def classifier() -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    model = CNN(0.1)
    x, y = torch.randn(64, 1, 8, 8), torch.randint(10, (64,))
    return model, lambda: nn.functional.cross_entropy(model(x), y)


def large(size_gb: float) -> tuple[nn.Module, Callable[[], torch.Tensor]]:
    layers = [(8192, 4096)] * max(1, round(size_gb * 8))  # 128 MiB of fp32 each
    model = nn.ParameterList([nn.Parameter(torch.randn(*s) * 0.01) for s in layers])
    rows = [torch.randn(8, s[1]) for s in layers]
    return model, lambda: sum((r @ p.T).square().mean() for r, p in zip(rows, model, strict=True))


def timed(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm: the first pays for allocation and imports
    seconds = []
    for _ in range(runs):
        began = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def measure(name: str, model: nn.Module, loss: Callable[[], torch.Tensor], runs: int) -> dict:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad()
        loss().backward()
        opt.step()

    step_s = timed(step, runs)
    mods = [("model", model)]
    cost_s = timed(lambda: fp.fingerprint(mods), runs)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return {
        "model": name,
        "bytes": nbytes,
        "step_s": step_s,
        "fingerprint_s": cost_s,
        "share_of_a_step": cost_s / step_s,
        "auto_every": fp.every(cost_s, step_s),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--size-gb", type=float, default=1.0)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for name, build in (
        ("embedding recipe", embedding),
        ("classifier recipe", classifier),
        (f"{args.size_gb:g} GiB of parameters", lambda: large(args.size_gb)),
    ):
        model, loss = build()
        rows.append(measure(name, model, loss, args.runs))
        del model, loss
    print(f"{'model':34} {'MB':>8} {'step s':>9} {'fingerprint s':>14} {'share':>7} {'auto K':>7}")
    for r in rows:
        k = r["auto_every"] if r["auto_every"] is not None else "off"
        print(
            f"{r['model']:34} {r['bytes'] / 1e6:8.1f} {r['step_s']:9.5f} "
            f"{r['fingerprint_s']:14.6f} {r['share_of_a_step']:7.2%} {k!s:>7}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
