"""``make demo``: train, get preempted (a real SIGKILL), resume, prove the runs are identical.

Runs real ``train.py`` processes on the embedded defaults and narrates:
1. an uninterrupted reference run;
2. the same run started with the requeue-safe ``+resume=latest``, killed with
   SIGKILL between two checkpoints (a preemption);
3. the same command again, which resumes from the newest verified checkpoint;
4. the per-step records and final parameters of both runs compared bit for bit;
5. ``recovery ls``, ``recovery verify`` and ``recovery audit`` on what was written:
   every checkpoint is signed (by a local dev key made on first use) and carries
   its provenance and lineage;
6. the same run with async saves at the auto interval, and what checkpointing
   cost it.
Everything goes under ``.demo/`` (removed first).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from recovery import faults, resume, trust
from recovery.cli import parameters_digest
from recovery.config import SigningConfig
from recovery.journal import effective_steps, read
from recovery.layout import METRICS_FILE, scan, step_dir_name

HERE = Path(__file__).resolve().parent
DEMO = HERE / ".demo"
ROOT = DEMO / "checkpoints"
STEPS = 1200
KILL_AT = 700


def say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def train(*overrides: str, kill_at: int | None = None) -> int:
    cmd = [sys.executable, str(HERE / "train.py"), f"checkpoint.root={ROOT}", *overrides]
    print("$ " + " ".join(["python", "train.py", *cmd[2:]]), flush=True)
    env = dict(os.environ)
    mark = DEMO / "paused"
    if kill_at is not None:
        env[faults.PAUSE_ENV] = f"step-{kill_at}"
        env[faults.MARK_ENV] = str(mark)
    proc = subprocess.Popen(cmd, cwd=HERE, env=env)
    if kill_at is not None:
        while not mark.exists():
            if proc.poll() is not None:
                raise SystemExit(f"train.py exited with {proc.returncode} before step {kill_at}")
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        print(f"--> sent SIGKILL to pid {proc.pid} after step {kill_at} (a preemption)", flush=True)
    return proc.wait()


def recovery(*args: str) -> int:
    print("$ recovery " + " ".join(args), flush=True)
    return subprocess.call([sys.executable, "-m", "recovery.cli", *args], cwd=HERE)


def main() -> int:
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    t0 = time.time()

    say(f"1. Reference: an uninterrupted run of {STEPS} steps")
    if train("run.name=reference") != 0:
        return 1

    say(f"2. The same run, preempted with SIGKILL after step {KILL_AT} (checkpoints every 200)")
    rc = train("run.name=demo", "+resume=latest", kill_at=KILL_AT)
    print(f"--> process ended by signal {-rc}; what survived on disk:", flush=True)
    recovery("ls", str(ROOT / "demo"))

    say("3. Requeued with the same command line: it resumes from the newest verified checkpoint")
    if train("run.name=demo", "+resume=latest") != 0:
        return 1

    say("4. Is the resumed run the same run? Every step's loss, lr and batch, and the final state")
    ref = effective_steps(ROOT / "reference" / METRICS_FILE)
    got = effective_steps(ROOT / "demo" / METRICS_FILE)
    diffs = [
        (s, k)
        for s in ref
        for k in ("loss", "lr", "batch", "epoch")
        if s not in got or got[s][k] != ref[s][k]
    ]
    keys = trust.resolve_trust(
        SigningConfig(
            trusted=str(HERE / ".recovery/trusted"), dev_key_dir=str(HERE / ".recovery/dev-key")
        )
    )
    a = resume.load(ROOT / "reference" / step_dir_name(STEPS), keys).decoded
    b = resume.load(ROOT / "demo" / step_dir_name(STEPS), keys).decoded
    pa, pb = parameters_digest(a.tree["model"]), parameters_digest(b.tree["model"])
    print(f"steps compared:          {len(ref)} (loss, lr, epoch, batch ids)")
    print(f"differences:             {len(diffs)}")
    print(f"first loss -> last loss: {ref[1]['loss']:.4f} -> {ref[STEPS]['loss']:.4f}")
    print(f"reference parameters:    sha256 {pa}")
    print(f"resumed parameters:      sha256 {pb}")
    same = not diffs and pa == pb
    print("verdict:                 " + ("BIT-IDENTICAL" if same else f"DIFFERENT at {diffs[:3]}"))

    say("5. The resumed run's checkpoints, each verified: hashes, signature, signer's trust")
    recovery("ls", str(ROOT / "demo"))
    newest = scan(ROOT / "demo").committed[-1][1]
    rc = recovery("verify", str(newest))

    say("6. Audit: provenance and lineage of the final checkpoint, back to the run's start")
    rc = rc or recovery("audit", str(newest))

    say("7. The same run with async saves at the auto (Young/Daly) interval: what it cost")
    if train("run.name=auto", "checkpoint.async=true", "checkpoint.interval=auto") != 0:
        return 1
    events = read(ROOT / "auto" / METRICS_FILE)
    summary = next(r for r in events if r.get("event") == "run_summary")
    saves = [r for r in events if r.get("event") == "checkpoint"]
    auto = resume.load(ROOT / "auto" / step_dir_name(STEPS), keys).decoded
    same_auto = parameters_digest(auto.tree["model"]) == pa
    interval = summary["interval"].get("seconds") or 0.0
    print(f"checkpoints written:     {len(saves)} (auto interval {interval:.1f} s)")
    pause_ms = sorted(r["pause_s"] for r in saves)[len(saves) // 2] * 1e3
    print(f"training pause, median:  {pause_ms:.2f} ms")
    print(f"checkpoint overhead:     {summary['checkpoint_fraction'] * 100:.2f}% of run time")
    print(
        "final parameters:        " + ("identical to the reference" if same_auto else "DIFFERENT")
    )
    same = same and same_auto
    print(f"\ndemo finished in {time.time() - t0:.1f}s; files under {DEMO}")
    return 0 if same and rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
