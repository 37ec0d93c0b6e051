"""Failures injected into one run, with one tier of checkpoints and with two.

    python benchmarks/bench_tiers.py [--size-mb 256] [--steps 300] [--step-ms 50]
        [--kills 4] [--every 100] [--local-every 10] [--async] [--json OUT]

The same training process (an own loop: ``Checkpointer``, ``TrainState``; a state of
``--size-mb`` of float32 parameters and ``--step-ms`` of compute a step, a sleep, so that
the step time is the same in both) runs ``--steps`` steps and is SIGKILLed at ``--kills``
steps drawn at random (``--seed``; the same steps for both), each time rerun with
``restore(state, "latest")`` until it finishes:

- **one tier**: a persistent checkpoint every ``--every`` steps;
- **two tiers**: the same, and a local snapshot (``checkpoint.local``, in ``/dev/shm``)
  every ``--local-every`` steps, each persistent checkpoint a promoted snapshot.

Reported per layout: steps redone per failure (the last step the killed process
journaled, less the step its successor resumed at), the checkpoint pause over the whole
run (the training thread's time in saves and snapshots, from the journal), and from
process start to the first step of each resumed process. And the local tier's resume
against the raw read of its bytes: ``recovery.run.resume.load`` of the newest snapshot
(signature, every digest, decode) against reading its files into memory.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RUN = "run"


def worker(args: argparse.Namespace) -> None:
    """One training process: resume the newest verified step, train to ``--steps``."""
    import torch

    from recovery import CheckpointConfig, Checkpointer, TrainState
    from recovery.config import LocalConfig

    width = 1024
    layers = max(1, int(args.size_mb * (1 << 20)) // (width * width * 4))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    absent = {"scheduler": "constant lr", "sampler": "synthetic batches"}
    state = TrainState(model=model, optimizer=opt, absent=absent)
    local = LocalConfig(every_steps=args.local_every, root=str(args.local_root))
    cfg = CheckpointConfig(
        every_steps=args.every, keep_last=2, async_save=args.async_save, local=local
    )
    first = next(iter(model.parameters()))
    with Checkpointer(cfg, args.dir / RUN, final_step=args.steps, config={"bench": 1}) as ckpt:
        step = ckpt.restore(state, "latest")
        while step < args.steps:
            time.sleep(args.step_ms / 1000.0)  # the step's compute
            first.grad = torch.full_like(first, 1.0)  # one tensor changes every step
            opt.step()
            step += 1
            ckpt.record(step, loss=float(first[0, 0].detach()))
            ckpt.maybe_save(state, step)


def run_layout(args: argparse.Namespace, kills: list[int], local_every: int) -> dict[str, Any]:
    """The whole run under ``kills``; its costs as the journal recorded them."""
    from recovery import faults
    from recovery.run.journal import read

    work = Path(tempfile.mkdtemp(prefix="bench-tiers-", dir=args.dir))
    shm = Path(tempfile.mkdtemp(prefix="bench-tiers-", dir=args.shm))
    cmd = [sys.executable, __file__, "--worker", "--dir", str(work), "--local-root", str(shm)]
    cmd += ["--size-mb", str(args.size_mb), "--steps", str(args.steps), "--every", str(args.every)]
    cmd += ["--local-every", str(local_every), "--step-ms", str(args.step_ms)]
    cmd += ["--async"] if args.async_save else []
    started, measured = time.perf_counter(), {}
    for kill in [*kills, None]:
        env = dict(os.environ)
        mark = work / "paused.mark"
        if kill is not None:
            env.update({faults.PAUSE_ENV: f"step-{kill}", faults.MARK_ENV: str(mark)})
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if kill is not None:
            while not mark.exists():
                if proc.poll() is not None:
                    raise SystemExit(f"worker ended before step {kill}: {proc.stderr.read()!r}")  # type: ignore[union-attr]
                time.sleep(0.01)
            proc.kill()
            mark.unlink()
        _, err = proc.communicate()
        if kill == kills[-1] and local_every:  # its snapshots are still there
            measured = local_resume(shm)
        if kill is None and proc.returncode != 0:
            raise SystemExit(f"worker failed: {err.decode()[-2000:]}")
    wall = time.perf_counter() - started
    records = read(work / RUN / "metrics.jsonl")
    redone, last, firsts = [], 0, []
    for rec in records:  # each process journals its steps in order
        if rec.get("event") is None and isinstance(rec.get("step"), int):
            last = rec["step"]
        if rec.get("event") == "resume":
            redone.append(last - rec["step"])
        if rec.get("event") == "first_step" and rec.get("resumed"):
            firsts.append(rec["seconds_since_process_start"])
    pauses = [
        r["pause_s"]
        for r in records
        if r.get("event") == "snapshot"
        or (r.get("event") == "checkpoint" and r.get("mode") != "promoted")
    ]
    compute = args.steps * args.step_ms / 1000.0
    result = {
        "local_every": local_every,
        "redone_per_failure": statistics.mean(redone) if redone else 0.0,
        "redone": redone,
        "checkpoint_pause_s": sum(pauses),
        "overhead_vs_compute": sum(pauses) / compute,
        "restart_to_first_step_s": statistics.median(firsts) if firsts else None,
        "wall_s": wall,
    }
    if measured:
        result["local_resume"] = measured
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)
    return result


def local_resume(shm: Path) -> dict[str, float]:
    """The newest local snapshot under ``shm``: its verified load (signature, every
    digest, decode) against a raw read of its files."""
    from recovery.format.layout import scan
    from recovery.integrity.signing import TrustStore
    from recovery.run import resume

    held = [c for rank in shm.glob("*/rank0") for c in scan(rank).committed]
    if not held:
        return {}
    path = max(held)[1]
    raw, ours = [], []
    for _ in range(3):
        began = time.perf_counter()
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            f.read_bytes()
        raw.append(time.perf_counter() - began)
        began = time.perf_counter()
        resume.load(path, TrustStore([]), allow_untrusted=True)
        ours.append(time.perf_counter() - began)
    r, o = statistics.median(raw), statistics.median(ours)
    return {"raw_read_s": r, "verified_load_s": o, "ratio": o / r}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--shm", type=Path, default=Path("/dev/shm"))
    p.add_argument("--local-root", type=Path, default=Path(f"/dev/shm/recovery-{os.geteuid()}"))
    p.add_argument("--size-mb", type=float, default=256.0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--kills", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=int, default=100)
    p.add_argument("--local-every", type=int, default=10)
    p.add_argument("--async", dest="async_save", action="store_true")
    p.add_argument(
        "--layouts", default="one,two", help="which to run: one,two (the comparison), or one"
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    args.shm.mkdir(parents=True, exist_ok=True)
    kills = sorted(random.Random(args.seed).sample(range(2, args.steps), args.kills))
    layouts = {"one": ("one tier", 0), "two": ("two tiers", args.local_every)}
    chosen = [layouts[name] for name in args.layouts.split(",")]
    results = {name: run_layout(args, kills, every) for name, every in chosen}
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "kills": kills}
    out.update({name.replace(" ", "_"): r for name, r in results.items()})
    one, two = results.get("one tier"), results.get("two tiers")
    if one is not None and two is not None:  # None: two tiers redid nothing
        lost = two["redone_per_failure"]
        out["fewer_redone"] = one["redone_per_failure"] / lost if lost else None
    for name, r in results.items():
        print(
            f"{name:>9}: {r['redone_per_failure']:.1f} steps redone per failure {r['redone']}, "
            f"checkpoint pause {r['checkpoint_pause_s']:.2f} s "
            f"({r['overhead_vs_compute']:.1%} of compute), restart to first step "
            f"{r['restart_to_first_step_s'] or 0:.2f} s"
        )
    if out.get("fewer_redone") is not None:
        print(f"{out['fewer_redone']:.1f}x fewer steps redone per failure with two tiers")
    elif "fewer_redone" in out:
        print("no step redone with two tiers")
    if two is not None and two.get("local_resume"):
        lr = two["local_resume"]
        print(
            f"local resume: verified load {lr['verified_load_s']:.3f} s, raw read "
            f"{lr['raw_read_s']:.3f} s ({lr['ratio']:.2f}x)"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
