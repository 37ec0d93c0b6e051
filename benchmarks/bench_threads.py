"""``python train.py`` with its default thread count against ``OMP_NUM_THREADS=1``, idle and busy.

    python benchmarks/bench_threads.py [--steps 300] [--runs 5] [--busy N] [--json OUT]

Each run is a fresh ``python train.py`` from the repository root (the embedding recipe,
``train.steps=STEPS``, only the final checkpoint, DVC off), into a run directory of its
own under a temporary checkpoint root, in two environments, interleaved:

- **default**: ``OMP_NUM_THREADS`` removed from the environment, as in a user's shell:
  ``train.threads`` (default ``auto``) decides;
- **OMP_NUM_THREADS=1**: what ``demo.py`` and the tests set.

First on the machine as it is (**idle**), then **busy**: ``--busy`` CPU-burning processes
(default one per core), started by the benchmark and stopped at its end, as other work
on a shared machine would be. Reported for each: medians of the process's wall-clock
seconds and of its training seconds (wall-clock minus the age of the process at its
first step, from the journal's ``first_step`` event: the steps, the checkpoint and
the exit), and default over ``OMP_NUM_THREADS=1``.

Last, the refusal that needs only a directory listing: ``python train.py`` into a run
directory that holds a checkpoint (exit 13), on the idle machine: its median and whether
it imported torch (``-X importtime`` of one more run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENVS = ("default", "OMP_NUM_THREADS=1")
"""The two environments compared, the first over the second."""
RUN_ARGS = ["checkpoint.every_steps=0", "checkpoint.dvc.enabled=false", "train.log_every=1000"]


def environment(label: str, key_dir: Path) -> dict[str, str]:
    """The child's environment: ours without ``OMP_NUM_THREADS`` (``default``) or with it 1."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["RECOVERY_DEV_KEY_DIR"] = str(key_dir)  # one dev key for every run, made once
    if label != "default":
        env["OMP_NUM_THREADS"] = "1"
    return env


def train(root: Path, name: str, steps: int, env: dict[str, str]) -> tuple[float, float]:
    """One ``python train.py`` run of ``steps`` steps: (wall-clock s, training s)."""
    argv = [sys.executable, "train.py", f"checkpoint.root={root}", f"run.name={name}"]
    start = time.perf_counter()
    done = subprocess.run(
        [*argv, f"train.steps={steps}", *RUN_ARGS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"train.py failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return wall, wall - first_step_age(root / name)


def first_step_age(run_dir: Path) -> float:
    """Seconds from the process's start to its first step, from the run's journal."""
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "first_step":
            return float(record["seconds_since_process_start"])
    raise SystemExit(f"{run_dir}: no first_step event in the journal")


def measure(root: Path, steps: int, runs: int, key_dir: Path, tag: str) -> dict[str, list]:
    """``runs`` runs of each environment, interleaved: label -> [(wall, training), ...]."""
    out: dict[str, list] = {label: [] for label in ENVS}
    for i in range(runs):
        for j, label in enumerate(ENVS):
            env = environment(label, key_dir)
            out[label].append(train(root, f"{tag}-{i}-{j}", steps, env))
    return out


def burn(count: int) -> list[subprocess.Popen[bytes]]:
    """``count`` processes that keep a core busy each until they are killed."""
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]


def refusal(root: Path, runs: int, key_dir: Path) -> tuple[list[float], bool]:
    """``python train.py`` into a run directory holding a checkpoint: wall-clock seconds of
    each run (exit 13 expected) and whether it imported torch."""
    env = environment("default", key_dir)
    argv = ["train.py", f"checkpoint.root={root}", "run.name=held"]
    train(root, "held", 2, env)  # one checkpoint, step 2
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True)
        times.append(time.perf_counter() - start)
        if done.returncode != 13:
            raise SystemExit(f"expected exit 13, got {done.returncode}: {done.stderr[-2000:]!r}")
    traced = subprocess.run(
        [sys.executable, "-X", "importtime", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    torch_in = any(line.split("|")[-1].strip() == "torch" for line in traced.stderr.splitlines())
    return times, torch_in


def medians(samples: dict[str, list]) -> dict[str, dict[str, float]]:
    """label -> median wall-clock and training seconds."""
    return {
        label: {
            "wall_s": statistics.median(w for w, _ in runs),
            "train_s": statistics.median(t for _, t in runs),
        }
        for label, runs in samples.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="train.steps of each run")
    ap.add_argument("--runs", type=int, default=5, help="runs of each environment (median)")
    ap.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="CPU burners")
    ap.add_argument("--json", default=None, help="write the medians and ratios here")
    args = ap.parse_args(argv)
    results: dict[str, dict[str, dict[str, float]]] = {}
    raw: dict[str, dict[str, list]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp:
        root, key_dir = Path(tmp) / "checkpoints", Path(tmp) / "dev-key"
        train(root, "warm-up", 2, environment("default", key_dir))  # data, dev key, caches
        raw["idle"] = measure(root, args.steps, args.runs, key_dir, "idle")
        burners = burn(args.busy)
        try:
            raw["busy"] = measure(root, args.steps, args.runs, key_dir, "busy")
        finally:
            for proc in burners:
                proc.kill()
                proc.wait()
        refused, torch_in = refusal(root, args.runs, key_dir)
    print(f"train.py, {args.steps} steps, medians of {args.runs}; busy: {args.busy} burners")
    heads = ("wall s", "train s", "wall x", "train x")
    print(f"{'machine':<8} {'environment':<20} " + " ".join(f"{h:>8}" for h in heads))
    for state, samples in raw.items():
        results[state] = med = medians(samples)
        base = med[ENVS[1]]
        for label, m in med.items():
            m["wall_x"] = m["wall_s"] / base["wall_s"]
            m["train_x"] = m["train_s"] / base["train_s"]
            print(
                f"{state:<8} {label:<20} {m['wall_s']:>8.2f} {m['train_s']:>8.2f} "
                f"{m['wall_x']:>8.2f} {m['train_x']:>8.2f}"
            )
    refusal_s = statistics.median(refused)
    print(f"refusal (exit 13): {refusal_s:.2f} s median, imports torch: {torch_in}")
    if args.json:
        doc = {
            "steps": args.steps,
            "runs": args.runs,
            "busy": args.busy,
            "medians": results,
            "all": raw,
            "refusal_s": refused,
            "refusal_imports_torch": torch_in,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
