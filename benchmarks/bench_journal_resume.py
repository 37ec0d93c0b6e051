"""A resume's time against the length of the run's journal.

    python benchmarks/bench_journal_resume.py [--steps 10000,100000,300000] [--runs 3] [--json OUT]

For each length: an own loop (a tiny model, the public API) journals that many steps
(``record``), saves its last step and closes; then a fresh process restores it
(``restore(state, "latest")``), timed around that call alone: the medians of
``--runs`` such processes. A resume reads the journal to verify its sealed events and
to keep the steps after its checkpoint for the self-check; what grows with the run is
that read.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MAKE = """
import sys, torch
from recovery import CheckpointConfig, Checkpointer, ResumeCheckConfig, TrainState
n, run = int(sys.argv[1]), sys.argv[2]
m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
st = TrainState(model=m, optimizer=o, absent={"scheduler": "none", "sampler": "none"})
cfg = CheckpointConfig(every_steps=n, resume_check=ResumeCheckConfig(fingerprint="off"))
with Checkpointer(cfg, run, final_step=n + 10, preemption=False) as ck:
    ck.restore(st)
    for s in range(1, n + 1):
        ck.record(s, loss=1.0 / s)
    ck.save(st, n)
"""

RESUME = """
import sys, time, torch
from recovery import CheckpointConfig, Checkpointer, TrainState
m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
st = TrainState(model=m, optimizer=o, absent={"scheduler": "none", "sampler": "none"})
ck = Checkpointer(CheckpointConfig(every_steps=10**9), sys.argv[1], final_step=10**9,
                  preemption=False)
began = time.perf_counter()
ck.restore(st, "latest")
print(time.perf_counter() - began)
ck.close()
"""


def python(code: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="10000,100000,300000")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="recovery-bench-journal-") as tmp:
        for n in (int(x) for x in args.steps.split(",")):
            run = Path(tmp) / f"r{n}"
            python(MAKE, str(n), str(run))
            seconds = [float(python(RESUME, str(run))) for _ in range(args.runs)]
            size = (run / "metrics.jsonl").stat().st_size
            rows.append({"steps": n, "journal_mb": size / 1e6, "resume_s": seconds,
                         "resume_s_median": statistics.median(seconds)})  # fmt: skip
            print(f"{n:>9} steps  {size / 1e6:8.1f} MB  resume {rows[-1]['resume_s_median']:.3f} s",
                  flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
