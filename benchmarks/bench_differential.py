"""Differential checkpoints against full ones, on a large sparse embedding run.

    python benchmarks/bench_differential.py [--intervals 25,50,100] [--runs 3] [--json OUT]
        [--users 200000] [--items 50000] [--interactions 1000000] [--steps 1000]
        [--full-every 10] [--against previous|full] [--min-mb MB] [--resume-interval 50]
        [--dir DIR] [--keep] [--dvc]

For each checkpoint interval (``--intervals``, in steps) ``python train.py`` trains
the embedding recipe twice, with the same seed and config: SparseAdam on the
embedding tables (``recipe.optim.sparse=true``), ``checkpoint.keep_last=3``,
synchronous saves, DVC off; once writing full checkpoints and once with
``checkpoint.differential.enabled=true`` (``full_every`` ``--full-every``,
``against`` ``--against``: each delta against the save before it, a chain, or
against the chain's full checkpoint; ``min_mb`` the config's default unless
``--min-mb``). Each run has its own
checkpoint root; both share one generated data set and one signing key.

Reported, from each run's journal (``metrics.jsonl``, one ``checkpoint`` record per
committed save):

- bytes per checkpoint (median; for the differential run its full bases and its
  deltas apart: save ``k`` of a fresh run is a base when ``k % full_every == 0``,
  checked against the kept checkpoints' own records), total bytes written over the
  run, and full over differential total bytes (the target: at least 5x);
- the median ``pause_s`` and ``write_s`` of the saves (the same here: saves are
  synchronous, the pause is the whole write);
- bit-identity: the final checkpoints of the two runs (step ``--steps``), verified
  and decoded by ``recovery.run.restoring.choose.load`` (a delta patched onto its base), hold
  bitwise-equal trees (every tensor's bits, every other leaf ``==``). The script
  exits 1 when they do not.

At ``--resume-interval`` (the nearest of ``--intervals``), resume time: the newest
kept delta of the differential run against the full run's checkpoint of the same
step. Each of ``--runs`` tries copies the checkpoint (a delta with its chain) into a
fresh run directory and resumes it there, ``python train.py ... +resume=<path>
train.steps=<step + 1>``, reading the journal's ``first_step`` record (process
start to the first resumed step: interpreter, imports, data, verify, decode, one
step); also timed in this process: ``choose.load`` alone (verify and decode, the
files in the page cache).

With ``--dvc`` each run's checkpoint root is a git + DVC repository with a local
remote, every checkpoint registered and pushed (``checkpoint.dvc.push=true``), and the
bytes each remote received are reported: what storage outlives the machine costs.

Last, what finding a delta's rows costs at save time on this state: ``delta.diff``
(every table's rows compared by their bits) of the full run's newest checkpoint
against the one an interval before, and the rejected alternative, tracking the
rows the batches touched: for ``interval`` steps of random user and item indices
(``recipe.batch_size`` 256, uniform: the run's items are drawn by popularity, so it
touches more item rows than the run did), ``torch.unique`` of each batch and a union
with the rows so far, then gathering those rows of every table (what a delta
writes). Medians of ``max(--runs, 5)`` repetitions in this process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from recovery.format import delta
from recovery.integrity.keys.signing import TrustStore, generate_keypair
from recovery.run.restoring import choose
from recovery.tools.drill import dvc_repo

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "train.py"
RUN = "run"
BATCH = 256
"""``recipe.batch_size`` (the recipe's default), for the touched-rows simulation."""
MB = 1e6
TARGET = 5.0
"""The issue's target: at least this many times fewer bytes over the run than full saves."""


def step_dir(run_dir: Path, step: int) -> Path:
    return run_dir / f"step-{step:08d}"


class Bench:
    """One benchmark's work directory, key and the ``train.py`` command line it runs."""

    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.work = work
        self.args = args
        self.key = work / "key"
        generate_keypair(self.key, overwrite=True)
        self.trust = TrustStore.from_paths([self.key / "recovery.pub"])
        self.env = {k: v for k, v in os.environ.items() if k != "RECOVERY_SIGNING_KEY"}

    def overrides(self, root: Path, interval: int, *, differential: bool) -> list[str]:
        a = self.args
        out = [
            "seed=0",
            f"run.name={RUN}",
            f"checkpoint.root={root}",
            f"recipe.data.root={self.work / 'data'}",
            f"recipe.data.num_users={a.users}",
            f"recipe.data.num_items={a.items}",
            f"recipe.data.num_interactions={a.interactions}",
            "recipe.optim.sparse=true",
            f"train.steps={a.steps}",
            f"train.log_every={max(a.steps, 1)}",
            f"checkpoint.every_steps={interval}",
            "checkpoint.keep_last=3",
            "checkpoint.async=false",
            *(
                ["checkpoint.dvc.enabled=true", "checkpoint.dvc.push=true"]
                if a.dvc
                else ["checkpoint.dvc.enabled=false"]
            ),
            f"signing.key={self.key / 'recovery.key'}",
            f"checkpoint.differential.enabled={str(differential).lower()}",
        ]
        if differential:
            out.append(f"checkpoint.differential.full_every={a.full_every}")
            out.append(f"checkpoint.differential.against={a.against}")
            if a.min_mb is not None:
                out.append(f"checkpoint.differential.min_mb={a.min_mb}")
        return out

    def train(self, overrides: list[str]) -> None:
        cmd = [sys.executable, str(TRAIN), *overrides]
        out = subprocess.run(
            cmd, cwd=self.work, env=self.env, capture_output=True, text=True, check=False
        )
        if out.returncode:
            tail = (out.stdout + out.stderr)[-4000:]
            raise SystemExit(f"train.py failed ({out.returncode}): {' '.join(cmd)}\n{tail}")

    def load(self, path: Path) -> choose.Loaded:
        return choose.load(path, self.trust)


def dvc_project(root: Path) -> None:
    """``root`` as a git + DVC repository with a local default remote (``root/remote``,
    ignored by git), as the drill's ``--dvc`` makes one."""
    dvc_repo(root)
    (root / ".gitignore").write_text("/remote\n")


def tree_bytes(root: Path) -> int:
    """The bytes of the files under ``root``."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def journal(run_dir: Path) -> list[dict[str, Any]]:
    """The journal's event records (the per-step records are left out)."""
    events = []
    with (run_dir / "metrics.jsonl").open() as fh:
        for line in fh:
            if line.startswith('{"event"'):
                events.append(json.loads(line))
    return events


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(events: list[dict[str, Any]], full_every: int | None) -> dict[str, Any]:
    """Counts, bytes and times of a run's committed saves; with ``full_every``, which
    saves are bases (``k % full_every == 0``) and which deltas."""
    saves = [e for e in events if e["event"] == "checkpoint"]
    kinds = [
        "base" if full_every is None or k % full_every == 0 else "delta" for k in range(len(saves))
    ]
    out: dict[str, Any] = {
        "checkpoints": len(saves),
        "bytes_median": median([e["bytes"] for e in saves]),
        "bytes_total": sum(e["bytes"] for e in saves),
        "pause_s_median": median([e["pause_s"] for e in saves]),
        "write_s_median": median([e["write_s"] for e in saves]),
        "saves": [
            {
                "step": e["step"],
                "kind": k,
                "bytes": e["bytes"],
                "pause_s": e["pause_s"],
                "write_s": e["write_s"],
            }
            for e, k in zip(saves, kinds, strict=True)
        ],
    }
    if full_every is not None:
        for kind in ("base", "delta"):
            mine = [e for e, k in zip(saves, kinds, strict=True) if k == kind]
            out[f"{kind}s"] = len(mine)
            out[f"{kind}_bytes_median"] = median([e["bytes"] for e in mine])
            out[f"{kind}_bytes_range"] = (
                [min(e["bytes"] for e in mine), max(e["bytes"] for e in mine)] if mine else None
            )
            out[f"{kind}_pause_s_median"] = median([e["pause_s"] for e in mine])
    return out


def kept(run_dir: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in run_dir.glob("step-*") if p.is_dir())


def bit_diff(a: Any, b: Any, where: str = "") -> list[str]:
    """Where two decoded trees differ: tensors by their bits, other leaves by ``==``."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(map(str, set(a) ^ set(b)))}"]
        return [d for k in a for d in bit_diff(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if type(a) is not type(b) or len(a) != len(b):
            return [f"{where}: {type(a).__name__}[{len(a)}] vs {type(b).__name__}[{len(b)}]"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in bit_diff(x, y, f"{where}[{i}]")
        ]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = a.dtype == b.dtype and a.shape == b.shape
        if same and a.numel():
            same = torch.equal(bits(a), bits(b))
        return [] if same else [f"{where}: tensors differ"]
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        same = a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
        return [] if same else [f"{where}: arrays differ"]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if type(a) is type(b) and a == b else [f"{where}: {a!r} vs {b!r}"]


def bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes (so NaN equals NaN and -0.0 differs from 0.0)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def flat(tree: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """A component's tensors by their path (``state/0/exp_avg``)."""
    if isinstance(tree, torch.Tensor):
        return {prefix: tree}
    items: Any = tree.items() if isinstance(tree, dict) else None
    if items is None and isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    if items is None:
        return {}
    out: dict[str, torch.Tensor] = {}
    for k, v in items:
        out |= flat(v, f"{prefix}/{k}" if prefix else str(k))
    return out


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def resume_times(
    bench: Bench, interval: int, full_dir: Path, diff_dir: Path, runs: int
) -> dict[str, Any]:
    """First-step and ``choose.load`` seconds from the newest kept delta and from the full
    run's checkpoint of the same step (each resumed from a copy in a fresh run dir)."""
    found = None
    for step in reversed(kept(diff_dir)):
        loaded = bench.load(step_dir(diff_dir, step))
        if loaded.delta is not None:
            found = (step, loaded.delta)
            break
    if found is None:
        return {"interval": interval, "skipped": "no delta kept in the differential run"}
    step, info = found
    delta_path = step_dir(diff_dir, step)
    full_path = step_dir(full_dir, step)
    if not full_path.is_dir():
        return {"interval": interval, "skipped": f"the full run kept no step {step}"}
    sources = {
        "full": ([full_path], False),
        "delta": ([delta_path, *(diff_dir / name for name in info["chain"])], True),
    }
    first: dict[str, list[float]] = {k: [] for k in sources}
    load_s: dict[str, list[float]] = {k: [] for k in sources}
    scratch = bench.work / "resume"
    for i in range(runs):
        for kind, (dirs, differential) in sources.items():
            shutil.rmtree(scratch, ignore_errors=True)
            run_dir = scratch / RUN
            for d in dirs:
                shutil.copytree(d, run_dir / d.name)
            target = run_dir / dirs[0].name
            overrides = bench.overrides(scratch, interval, differential=differential)
            bench.train([*overrides, f"train.steps={step + 1}", f"+resume={target}"])
            events = journal(run_dir)
            resumed = [e for e in events if e["event"] == "resume"]
            if not resumed or ("base" in resumed[-1]) != differential:
                raise SystemExit(f"{kind} resume of {target}: unexpected journal {resumed}")
            rec = [e for e in events if e["event"] == "first_step" and e.get("resumed")]
            first[kind].append(float(rec[-1]["seconds_since_process_start"]))
            load_s[kind].append(timed(partial(bench.load, target))[0])
        line = ", ".join(f"{k} {v[-1]:.2f} s" for k, v in first.items())
        print(f"resume {i + 1}/{runs}: first step from {line}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    read = {
        "full": sum(r.size for r in bench.load(full_path).manifest.files),
        "delta": info["bytes"] + info["chain_bytes"],  # the delta and every link below it
    }
    return {
        "interval": interval,
        "step": step,
        "delta_sequence": info["sequence"],
        "delta_bytes": info["bytes"],
        "base_bytes": info["base_bytes"],
        "bytes_read": read,
        "first_step_s_median": {k: statistics.median(v) for k, v in first.items()},
        "first_step_s": first,
        "load_s_median": {k: statistics.median(v) for k, v in load_s.items()},
        "load_s": load_s,
    }


def delta_cost(
    bench: Bench, interval: int, full_dir: Path, min_bytes: int, runs: int
) -> dict[str, Any]:
    """Seconds to find and gather a delta's rows: by bits (``delta.diff``) against
    tracking the rows ``interval`` steps of random batches touched."""
    steps = kept(full_dir)
    if len(steps) < 2:
        return {"skipped": "fewer than two kept checkpoints"}
    cur = bench.load(step_dir(full_dir, steps[-1])).decoded.tree
    base = bench.load(step_dir(full_dir, steps[-2])).decoded.tree
    comps = {name: (flat(cur[name]), flat(base[name])) for name in cur}
    tables = {
        f"{name}/{k}": t
        for name, (ts, _) in comps.items()
        for k, t in ts.items()
        if delta.is_table(t, min_bytes)
    }

    def by_bits() -> int:
        changed = 0
        for now, then in comps.values():
            _, patched = delta.diff(now, then, min_bytes)
            changed += sum(p["changed"] for p in patched.values())
        return changed

    a = bench.args
    users = {k for k, t in tables.items() if t.shape[0] == a.users}
    gen = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randint(a.users, (BATCH,), generator=gen),
            torch.randint(a.items, (BATCH,), generator=gen),
        )
        for _ in range(interval)
    ]

    def track() -> tuple[torch.Tensor, torch.Tensor]:
        seen_u = torch.empty(0, dtype=torch.int64)
        seen_i = torch.empty(0, dtype=torch.int64)
        for u, i in batches:
            seen_u = torch.unique(torch.cat([seen_u, torch.unique(u)]))
            seen_i = torch.unique(torch.cat([seen_i, torch.unique(i)]))
        return seen_u, seen_i

    def gather(rows: tuple[torch.Tensor, torch.Tensor]) -> int:
        n = 0
        for k, t in tables.items():
            idx = rows[0] if k in users else rows[1]
            n += int(t.index_select(0, idx).shape[0])
        return n

    bit_s, track_s, gather_s = [], [], []
    changed = touched = 0
    for _ in range(max(runs, 5)):
        s, changed = timed(by_bits)
        bit_s.append(s)
        s, rows = timed(track)
        track_s.append(s)
        s, touched = timed(partial(gather, rows))
        gather_s.append(s)
    return {
        "steps": [steps[-2], steps[-1]],
        "tables": {k: list(t.shape) for k, t in tables.items()},
        "table_bytes": sum(t.numel() * t.element_size() for t in tables.values()),
        "diff_s_median": statistics.median(bit_s),
        "changed_rows": changed,
        "track_s_median": statistics.median(track_s),
        "track_gather_s_median": statistics.median(gather_s),
        "touched_rows": touched,
        "tracked_steps": interval,
    }


def mb(x: float | None) -> str:
    return "-" if x is None else f"{x / MB:.2f}"


def span(d: dict[str, Any]) -> str:
    r = d.get("delta_bytes_range")
    return "-" if not r else f"{mb(r[0])}-{mb(r[1])}"


def ratio_s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def sec(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--intervals", default="25,50,100", help="comma-separated, in steps")
    ap.add_argument("--users", type=int, default=200_000)
    ap.add_argument("--items", type=int, default=50_000)
    ap.add_argument("--interactions", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--full-every", type=int, default=20)
    ap.add_argument("--against", choices=("previous", "full"), default="previous")
    ap.add_argument("--min-mb", type=float, default=None, help="default: the config's (1)")
    ap.add_argument("--resume-interval", type=int, default=50)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where runs are written (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="leave the runs on disk")
    ap.add_argument(
        "--dvc",
        action="store_true",
        help="each run in a git + DVC repo, every checkpoint pushed: report the remote's bytes",
    )
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)
    intervals = [int(x) for x in args.intervals.split(",")]

    made = args.dir is None
    work = Path(args.dir or tempfile.mkdtemp(prefix="recovery-bench-diff-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    created: list[Path] = []
    try:
        return run(args, intervals, work, created)
    finally:
        if not args.keep:
            for p in [work] if made else created:
                shutil.rmtree(p, ignore_errors=True)
        else:
            print(f"runs kept in {work}")


def run(args: argparse.Namespace, intervals: list[int], work: Path, created: list[Path]) -> int:
    created += [work / "key", work / "data", work / "resume"]
    bench = Bench(work, args)
    print(
        f"{args.users} users, {args.items} items, {args.interactions} interactions, "
        f"{args.steps} steps, intervals {intervals}, full_every {args.full_every}; dir {work}",
        flush=True,
    )
    results: dict[str, Any] = {}
    identity: dict[str, Any] = {}
    dirs: dict[int, tuple[Path, Path]] = {}
    for interval in intervals:
        roots = {kind: work / f"every-{interval}-{kind}" for kind in ("full", "diff")}
        created += roots.values()
        for kind, root in roots.items():
            shutil.rmtree(root, ignore_errors=True)
            if args.dvc:
                dvc_project(root)
            t0 = time.perf_counter()
            bench.train(bench.overrides(root, interval, differential=kind == "diff"))
            s = time.perf_counter() - t0
            print(f"every {interval}: {kind} run {s:.1f} s", flush=True)
        full_dir, diff_dir = roots["full"] / RUN, roots["diff"] / RUN
        dirs[interval] = (full_dir, diff_dir)
        full = summarize(journal(full_dir), None)
        diff = summarize(journal(diff_dir), args.full_every)
        for step in kept(diff_dir):  # the positional kinds, checked where a record is kept
            is_delta = bench.load(step_dir(diff_dir, step)).delta is not None
            listed = [s["kind"] for s in diff["saves"] if s["step"] == step]
            if listed and listed[-1] != ("delta" if is_delta else "base"):
                raise SystemExit(f"every {interval}: step {step} is not a {listed[-1]}")
        ratio = full["bytes_total"] / diff["bytes_total"] if diff["bytes_total"] else None
        results[str(interval)] = {
            "full": full,
            "differential": diff,
            "ratio": ratio,
            "target_5x": ratio is not None and ratio >= TARGET,
        }
        if args.dvc:  # what each run's remote received (DVC stores each file once, by md5)
            results[str(interval)]["pushed_bytes"] = {
                kind: tree_bytes(root / "remote") for kind, root in roots.items()
            }
        a = bench.load(step_dir(full_dir, args.steps)).decoded.tree
        b = bench.load(step_dir(diff_dir, args.steps)).decoded.tree
        differs = bit_diff(a, b)
        identity[str(interval)] = {"identical": not differs, "differs": differs[:10]}
        print(
            f"every {interval}: full / diff bytes {ratio_s(ratio)}, final step {args.steps} "
            f"{'bit-identical' if not differs else 'DIFFERS: ' + '; '.join(differs[:3])}",
            flush=True,
        )

    main_interval = min(intervals, key=lambda i: (abs(i - args.resume_interval), i))
    full_dir, diff_dir = dirs[main_interval]
    resumed = resume_times(bench, main_interval, full_dir, diff_dir, args.runs)
    min_mb = 1.0 if args.min_mb is None else args.min_mb
    cost = delta_cost(bench, main_interval, full_dir, int(min_mb * (1 << 20)), args.runs)
    identical = all(v["identical"] for v in identity.values())

    print(
        "\n| every | saves | full MB/ckpt | diff base MB | diff delta MB median (min-max) | "
        "total full MB | total diff MB | full / diff | pause s full / diff | "
        "write s full / diff |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for every, r in results.items():
        f, d = r["full"], r["differential"]
        print(
            f"| {every} | {f['checkpoints']} | {mb(f['bytes_median'])} | "
            f"{mb(d['base_bytes_median'])} | {mb(d['delta_bytes_median'])} ({span(d)}) | "
            f"{mb(f['bytes_total'])} | {mb(d['bytes_total'])} | "
            f"{ratio_s(r['ratio'])} | "
            f"{sec(f['pause_s_median'])} / {sec(d['pause_s_median'])} | "
            f"{sec(f['write_s_median'])} / {sec(d['write_s_median'])} |"
        )
    if "skipped" in resumed:
        print(f"\nresume: skipped ({resumed['skipped']})")
    else:
        print(
            f"\nresume at step {resumed['step']} (every {main_interval}; the delta is "
            f"#{resumed['delta_sequence']} on its base), median of {args.runs}:"
        )
        print("\n| resumed from | MB read | first step s (process start) | choose.load s |")
        print("|---|---:|---:|---:|")
        for kind in ("full", "delta"):
            print(
                f"| {kind} | {mb(resumed['bytes_read'][kind])} | "
                f"{sec(resumed['first_step_s_median'][kind])} | "
                f"{sec(resumed['load_s_median'][kind])} |"
            )
    if "skipped" not in cost:
        print(
            f"\nfinding a delta's rows ({mb(cost['table_bytes'])} MB of tables, "
            f"steps {cost['steps'][0]} -> {cost['steps'][1]}):"
        )
        print("\n| method | s | rows |")
        print("|---|---:|---:|")
        print(
            f"| delta.diff (bits, at save) | {sec(cost['diff_s_median'])} | "
            f"{cost['changed_rows']} changed |"
        )
        print(
            f"| touched rows: unique + union over {main_interval} steps | "
            f"{sec(cost['track_s_median'])} | - |"
        )
        print(
            f"| touched rows: gather (at save) | {sec(cost['track_gather_s_median'])} | "
            f"{cost['touched_rows']} touched |"
        )
    if args.dvc:
        print("\n| every | pushed MB full | pushed MB diff | full / diff |")
        print("|---:|---:|---:|---:|")
        for every, r in results.items():
            got = r["pushed_bytes"]
            print(
                f"| {every} | {mb(got['full'])} | {mb(got['diff'])} | "
                f"{ratio_s(got['full'] / got['diff'] if got['diff'] else None)} |"
            )
    met = [k for k, r in results.items() if r["target_5x"]]
    print(f"\ntarget >= {TARGET:g}x fewer bytes: met at every {met or 'none'} of {list(results)}")
    print(f"identical: {str(identical).lower()}")

    doc = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "config": {
            "users": args.users,
            "items": args.items,
            "interactions": args.interactions,
            "steps": args.steps,
            "intervals": intervals,
            "full_every": args.full_every,
            "min_mb": min_mb,
            "runs": args.runs,
            "dvc": args.dvc,
        },
        "intervals": results,
        "identity": identity,
        "identical": identical,
        "resume": resumed,
        "delta_cost": cost,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
