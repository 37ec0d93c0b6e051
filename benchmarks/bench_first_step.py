"""From process start to the first resumed optimizer step, against a bare torch.load.

    python benchmarks/bench_first_step.py [--size-gb 1.0] [--runs 5] [--json OUT]

A run of an own loop (the public API: ``Checkpointer``, ``TrainState``) saves
the benchmark's state (the model and Adam moments of ``bench_checkpoint.py``)
once. Then each run starts fresh processes, with the files in the page cache:

- **ours**: ``import recovery``, build the model and optimizer, ``restore(state,
  "latest")`` (find the newest checkpoint, verify its signature and every
  byte, load), one optimizer step, ``maybe_save``: the journal's
  ``first_step`` event records the seconds since the process started;
- **baseline**: ``import torch`` and ``torch.load`` (weights_only) of the same
  state as one ``.pt`` file, and nothing else: no model built, no step, no
  verification;
- **by hand**: what an unverified hand-written resume costs: ``import torch``,
  build the same model and optimizer, ``torch.load``, ``load_state_dict`` of
  both, one optimizer step.

Reported: medians, and ours over the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RUN = "run"


def shapes(size_gb: float) -> list[tuple[int, ...]]:
    """The parameter shapes of the benchmark state (about a third of ``size_gb``)."""
    sys.path.insert(0, str(BENCH))
    from workload import make_state

    return [tuple(t.shape) for t in make_state(size_gb, fill=False)["model"].values()]


def build(size_gb: float) -> tuple[Any, Any]:
    """The benchmark's model (its parameters uninitialised) and an Adam over it."""
    import torch
    from torch import nn

    model = nn.Module()
    model.params = nn.ParameterList(nn.Parameter(torch.empty(s)) for s in shapes(size_gb))
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def step(model: Any, opt: Any) -> None:
    sum(p.sum() for p in model.params).backward()
    opt.step()


def child_by_hand(work: Path, size_gb: float) -> float:
    """Build, ``torch.load``, load both state dicts, step once; the seconds since start."""
    import torch

    model, opt = build(size_gb)
    tree = torch.load(work / "ckpt.pt", weights_only=True)
    model.load_state_dict(tree["model"])
    opt.load_state_dict(tree["optimizer"])
    step(model, opt)
    return age()


def age() -> float:
    from recovery.run.scheduling.cadence import process_age_s

    seconds = process_age_s()
    if seconds is None:
        raise SystemExit("needs Linux /proc to time the process")
    return seconds


def child_ours(work: Path, size_gb: float, save: bool) -> float:
    """Build, restore, step once; return the journal's seconds to the first step."""
    import torch
    from torch import nn

    import recovery
    from recovery.integrity.keys.signing import Signer, TrustStore

    model, opt = build(size_gb)
    if save:
        torch.manual_seed(0)
        for p in model.params:
            nn.init.normal_(p)
    absent = {"scheduler": "constant lr", "sampler": "no data"}
    state = recovery.TrainState(model=model, optimizer=opt, absent=absent)
    signer = Signer(work / "key" / "recovery.key")
    trust = TrustStore.from_paths([work / "key" / "recovery.pub"])
    cfg = recovery.CheckpointConfig(every_steps=1 if save else 1000)
    kw = {"signer": signer, "trust": trust, "preemption": False, "health": False}
    with recovery.Checkpointer(cfg, work / RUN, final_step=10**6, **kw) as ckpt:
        resumed = ckpt.restore(state, "latest")
        if save != (resumed == 0):
            raise SystemExit(f"expected {'a fresh start' if save else 'a resume'}, got {resumed}")
        step(model, opt)
        ckpt.maybe_save(state, resumed + 1)
    if save:
        tree = {"model": model.state_dict(), "optimizer": opt.state_dict()}
        torch.save(tree, work / "ckpt.pt")
        return 0.0
    events = [json.loads(line) for line in (work / RUN / "metrics.jsonl").open()]
    first = [e for e in events if e.get("event") == "first_step" and e.get("resumed")]
    return float(first[-1]["seconds_since_process_start"])


def child_baseline(work: Path) -> float:
    """``import torch`` and ``torch.load``; return the seconds since the process started."""
    import torch

    torch.load(work / "ckpt.pt", weights_only=True)
    return age()


def run_child(*args: str) -> float:
    out = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    if out.returncode:
        raise SystemExit(f"child {args} failed:\n{out.stdout}{out.stderr}")
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", default=None)
    kinds = ["save", "ours", "baseline", "by-hand"]
    ap.add_argument("--child", choices=kinds, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        work = Path(args.dir)
        if args.child == "baseline":
            print(child_baseline(work))
        elif args.child == "by-hand":
            print(child_by_hand(work, args.size_gb))
        else:
            print(child_ours(work, args.size_gb, save=args.child == "save"))
        return 0

    from recovery.integrity.keys.signing import generate_keypair

    work = Path(tempfile.mkdtemp(prefix="recovery-first-step-"))
    try:
        generate_keypair(work / "key")
        common = ["--dir", str(work), "--size-gb", str(args.size_gb)]
        run_child("--child", "save", *common)
        size = os.path.getsize(work / "ckpt.pt")
        times: dict[str, list[float]] = {"ours": [], "baseline": [], "by-hand": []}
        for i in range(args.runs):
            for kind in times:
                times[kind].append(run_child("--child", kind, *common))
            line = ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items())
            print(f"run {i + 1}/{args.runs}: {line}", flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        ratios = {k: med["ours"] / med[k] for k in ("baseline", "by-hand")}
        print(f"state {size / 2**30:.3f} GiB (model + Adam moments)")
        print(f"ours: start to first resumed step, verified   {med['ours']:.3f} s")
        print(f"baseline: import torch + torch.load           {med['baseline']:.3f} s")
        print(f"by hand: build, torch.load, load, one step     {med['by-hand']:.3f} s")
        print(f"ratio to baseline {ratios['baseline']:.2f}, to by hand {ratios['by-hand']:.2f}")
        if args.json:
            doc = {"state_bytes": size, "runs": args.runs, "median_s": med, "all_s": times}
            Path(args.json).write_text(json.dumps({**doc, "ratios": ratios}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
