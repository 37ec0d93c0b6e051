"""A resume's and ``recovery ls``'s time against the length of the run's journal.

    python benchmarks/bench_journal_resume.py [--steps 10000,100000,1000000] [--runs 3] [--json OUT]

For each length: an own loop (a tiny model, the public API) journals that many steps
(``record``, timed: microseconds a step), saves its last step (``--every K``: every K
steps, retention keeping the last 3) and closes; then fresh processes restore it (``restore(state,
"latest")``, timed around that call alone) and run ``recovery ls`` on it (timed around
``main()`` in the process, and as the whole command from outside): the medians of
``--runs`` of each. A resume reads the journal's events (to verify its sealed chain) and
the per-step records after its checkpoint (the self-check); ``ls`` reads its events.
``--no-index`` deletes the journal's index first: the whole journal is read, as before
the index existed.
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

ROOT = Path(__file__).resolve().parents[1]

MAKE = """
import sys, time, torch
from recovery import CheckpointConfig, Checkpointer, ResumeCheckConfig, TrainState
n, run, every = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]) or int(sys.argv[1])
m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
st = TrainState(model=m, optimizer=o, absent={"scheduler": "none", "sampler": "none"})
cfg = CheckpointConfig(every_steps=every, keep_last=3,
                       resume_check=ResumeCheckConfig(fingerprint="off"))
with Checkpointer(cfg, run, final_step=n + 10, preemption=False) as ck:
    ck.restore(st)
    began = time.perf_counter()
    for s in range(1, n + 1):
        ck.record(s, loss=1.0 / s)
        ck.maybe_save(st, s)
    print((time.perf_counter() - began) / n * 1e6)
"""

LS = """
import sys, time
from recovery.cli.main import main
began = time.perf_counter()
try:
    main(["ls", sys.argv[1]])
except SystemExit:
    pass
print(time.perf_counter() - began)
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
    p.add_argument("--steps", default="10000,100000,1000000")
    p.add_argument("--every", type=int, default=0, help="steps between saves (0: the last)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--no-index", action="store_true", help="read the whole journal (as before)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="recovery-bench-journal-") as tmp:
        for n in (int(x) for x in args.steps.split(",")):
            run = Path(tmp) / f"r{n}"
            record_us = float(python(MAKE, str(n), str(run), str(args.every)))
            if args.no_index:
                (run / "metrics.jsonl.index").unlink()
            size = (run / "metrics.jsonl").stat().st_size
            ls_s, ls_wall = [], []
            for _ in range(args.runs):
                began = time.perf_counter()
                ls_s.append(float(python(LS, str(run))))
                ls_wall.append(time.perf_counter() - began)
            # the resumes last: each one journals (and indexes) what it did
            seconds = []
            for _ in range(args.runs):
                if args.no_index:  # each resume indexes the journal as it writes
                    (run / "metrics.jsonl.index").unlink(missing_ok=True)
                seconds.append(float(python(RESUME, str(run))))
            row = {"steps": n, "journal_mb": size / 1e6, "record_us": record_us,
                   "resume_s": seconds, "resume_s_median": statistics.median(seconds),
                   "ls_s": ls_s, "ls_s_median": statistics.median(ls_s),
                   "ls_command_s_median": statistics.median(ls_wall)}  # fmt: skip
            rows.append(row)
            print(f"{n:>9} steps  {size / 1e6:8.1f} MB  record {record_us:5.1f} us  resume "
                  f"{row['resume_s_median']:.3f} s  ls {row['ls_s_median']:.3f} s "
                  f"(command {row['ls_command_s_median']:.2f} s)", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
