"""What the resume self-check costs: at start (the journal read) and per redone step.

For journals of N steps (records as the recipes write them: step, epoch, loss, lr,
batch digest, update; a checkpoint event every 100 steps), measures the median over
``--runs`` of:

- ``read``: the journal read the resume does anyway (``history.read``: parse, check
  the seals of its steering events, the run's history); the journal is written here
  without its index (``metrics.jsonl.index``), so this is the whole read a journal of
  an older version gets (``bench_journal_resume.py`` measures the read through the index);
- ``unsealed``: the same read without checking the seals (parse and history only), the
  baseline of what checking the sealed events (one every 100 steps) adds;
- ``keep``: the self-check's step -> record map, measured alone over the parsed records
  (a resume builds it from the records after its checkpoint: ``journal.steps_after``);
- ``write``: one per-step record written through the journal, without and with the
  check watching it (``compare``), over the redone steps of one interval.

    python benchmarks/bench_resume_check.py --steps 10000,100000,1000000 --runs 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from recovery.config import ResumeCheckConfig
from recovery.integrity.keys import seal
from recovery.integrity.keys.signing import Signer, TrustStore, generate_keypair
from recovery.run import journal
from recovery.run.restoring import history
from recovery.run.restoring.selfcheck import ResumeCheck
from recovery.state.sampler import batch_digest


def record(step: int) -> dict[str, Any]:
    return {"step": step, "epoch": step // 1000, "loss": 1.0 / (step + 1), "lr": 3e-4,
            "batch": batch_digest([step]), "update": 0.001 * step}  # fmt: skip


def write_journal(path: Path, steps: int, signer: Signer) -> None:
    """A run's journal: its steering events sealed as a run's writer seals them."""
    tip = ""

    def sealed(event: dict[str, Any]) -> str:
        nonlocal tip
        event = seal.seal(event, tip, signer)
        tip = seal.link(event)
        return json.dumps(event, separators=(",", ":")) + "\n"

    with open(path, "w", encoding="utf-8") as fh:
        fh.write(sealed({"event": "start", "run_id": "r"}))
        for s in range(1, steps + 1):
            fh.write(json.dumps(record(s), separators=(",", ":")) + "\n")
            if s % 100 == 0:
                fh.write(sealed({"event": "checkpoint", "step": s, "pause_s": 0.1, "run_id": "r"}))


def step_map(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """What the self-check added to the journal read: step -> its last record."""
    return {r["step"]: r for r in records if "event" not in r}


def unsealed(path: Path) -> history.History:
    """The same read without checking the seals: the baseline of what the check adds."""
    return history.from_records(journal.read(path))


def timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def per_record(tmp: Path, *, checked: bool, redone: int = 100) -> float:
    """Seconds per record written, over ``redone`` records (with the check: all compared)."""
    j = journal.Journal(tmp / f"w-{checked}.jsonl")
    if checked:
        expected = {s: record(s) for s in range(1, redone + 1)}
        j.watch(ResumeCheck(expected, resumed_at=0, cfg=ResumeCheckConfig(), journal=j))
    start = time.perf_counter()
    for s in range(1, redone + 1):
        j.write(record(s))
    elapsed = time.perf_counter() - start
    j.close()
    return elapsed / redone


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", default="10000,100000,1000000")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        signer = Signer(generate_keypair(tmp / "key")[0])
        trust = TrustStore().with_signer(signer)
        for n in (int(x) for x in args.steps.split(",")):
            path = tmp / f"j{n}.jsonl"
            write_journal(path, n, signer)
            records = journal.read(path)
            reads = [timed(partial(history.read, path, trust)) for _ in range(args.runs)]
            plains = [timed(partial(unsealed, path)) for _ in range(args.runs)]
            keeps = [timed(partial(step_map, records)) for _ in range(args.runs)]
            row = {"steps": n, "bytes": path.stat().st_size, "read_s": statistics.median(reads),
                   "unsealed_s": statistics.median(plains),
                   "keep_s": statistics.median(keeps)}  # fmt: skip
            row["keep_share"] = row["keep_s"] / row["read_s"]
            rows.append(row)
            print(
                f"{n:>9} steps ({row['bytes'] / 1e6:6.1f} MB): journal read {row['read_s']:.3f} s, "
                f"of which the self-check's map {row['keep_s']:.3f} s "
                f"({100 * row['keep_share']:.1f} %); unsealed read {row['unsealed_s']:.3f} s "
                f"(seals {row['read_s'] / row['unsealed_s']:.2f}x)"
            )
        plain = statistics.median(per_record(tmp, checked=False) for _ in range(args.runs))
        checked = statistics.median(per_record(tmp, checked=True) for _ in range(args.runs))
    print(
        f"per redone step: record written {1e6 * plain:.1f} us, with the comparison "
        f"{1e6 * checked:.1f} us ({checked / plain:.2f}x)"
    )
    if args.json:
        args.json.write_text(json.dumps({"journal": rows, "write_us": 1e6 * plain,
                                         "write_checked_us": 1e6 * checked}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
