"""How long ``recovery`` takes to answer, against a bare interpreter and ``import torch``.

    python benchmarks/bench_cli_startup.py [--runs 7] [--json OUT]

A small run is made first by an own loop (``examples/plain_loop.py``: the public
API, 20 steps, a checkpoint every 10). Then each command runs ``--runs`` times as a
fresh process (the console script, from the repository root, as a user types it),
interleaved so that the machine's noise spreads over all of them:

- ``python -c pass``: the interpreter alone, the floor;
- ``python -c "import torch"``: what a command that imports torch cannot go under;
- ``recovery --help``, ``recovery --version``, ``recovery ls RUN``,
  ``recovery verify RUN/step-00000020``.

Reported: wall-clock medians, each over ``python -c pass`` and over ``import torch``,
and whether the command imported torch (``-X importtime`` of one more run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECOVERY = str(Path(sys.executable).with_name("recovery"))
SMALL_RUN = ["--steps", "20", "--every", "10", "--workers", "0"]


def commands(run_dir: Path) -> dict[str, list[str]]:
    """Each measured command line, by its label."""
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        'python -c "import torch"': [sys.executable, "-c", "import torch"],
        "recovery --help": [RECOVERY, "--help"],
        "recovery --version": [RECOVERY, "--version"],
        "recovery ls RUN": [RECOVERY, "ls", str(run_dir)],
        "recovery verify RUN/step-00000020": [RECOVERY, "verify", str(run_dir / "step-00000020")],
    }


def make_run(run_dir: Path) -> None:
    """The small run every command reads: 20 steps of the own-loop example."""
    subprocess.run(
        [sys.executable, "examples/plain_loop.py", "--run-dir", str(run_dir), *SMALL_RUN],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )


def seconds(argv: list[str]) -> float:
    """Wall-clock seconds of one run of ``argv`` (it must succeed)."""
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def imports_torch(argv: list[str]) -> bool:
    """Whether ``argv`` (a console script or ``python -c``) imports torch."""
    script = argv[1:] if argv[0] == sys.executable else argv
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *script], cwd=ROOT, capture_output=True, text=True
    )
    return any(line.split("|")[-1].strip() == "torch" for line in done.stderr.splitlines())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="runs of each command (median)")
    ap.add_argument("--json", default=None, help="write the medians and ratios here")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        run_dir = Path(tmp) / "checkpoints" / "run"
        make_run(run_dir)
        lines = commands(run_dir)
        times: dict[str, list[float]] = {label: [] for label in lines}
        for _ in range(args.runs):
            for label, cmd in lines.items():
                times[label].append(seconds(cmd))
        torch_in = {label: imports_torch(cmd) for label, cmd in lines.items()}
    med = {label: statistics.median(t) for label, t in times.items()}
    floor, torch_s = med["python -c pass"], med['python -c "import torch"']
    print(f"{'command':<36} {'median s':>9} {'/ pass':>7} {'/ torch':>8}  torch?")
    for label, m in med.items():
        print(
            f"{label:<36} {m:>9.3f} {m / floor:>7.2f} {m / torch_s:>8.2f}  "
            + ("yes" if torch_in[label] else "no")
        )
    if args.json:
        doc = {
            "runs": args.runs,
            "median_s": med,
            "over_python": {k: m / floor for k, m in med.items()},
            "over_import_torch": {k: m / torch_s for k, m in med.items()},
            "imports_torch": torch_in,
            "all_s": times,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
