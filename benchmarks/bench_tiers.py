"""Failures injected into one run, one tier of checkpoints against two, each at its best interval.

    python benchmarks/bench_tiers.py [--size-mb 256] [--steps 300] [--step-ms 50]
        [--kills 4] [--async] [--hash sha256|blake3] [--shard-mb MB] [--host-loss 0.1]
        [--repeat 1] [--every N --local-every K] [--store-mbps 10,40] [--json OUT]

The same training process (an own loop: ``Checkpointer``, ``TrainState``; a state of
``--size-mb`` of float32 parameters and ``--step-ms`` of compute a step, a sleep, so that
the step time is the same in both) runs ``--steps`` steps and is SIGKILLed at ``--kills``
steps drawn at random (``--seed``; the same steps for both), each time rerun with
``restore(state, "latest")`` until it finishes:

- **one tier**: a persistent checkpoint every ``every`` steps;
- **two tiers**: a local snapshot (``checkpoint.local``, in ``/dev/shm``) every
  ``local_every`` steps, and every ``every2`` steps a persistent checkpoint, promoted from
  that step's snapshot.

**The intervals.** Unless ``--every`` and ``--local-every`` are given (then both layouts
use them, the old hand-picked comparison), a calibration pass first measures on this
machine, in two short runs whose saves never overlap (each one waited for): a persistent
save's pause C and write W (one tier), and a local snapshot's pause C_local and write
W_local and its promotion's write W_promote (two tiers). With MTBF = the run's compute
time / ``--kills`` (the failure rate injected), :func:`choose` takes Young/Daly per tier
(:func:`recovery.run.tiers.rules.young_daly` and
:func:`~recovery.run.tiers.rules.plan`), each bounded below by what the tier sustains:
an interval is never shorter than its write (a save or a
snapshot cannot start before the previous one is written). The choice and its arithmetic
are printed and recorded.

**On a slow store** (``--store-mbps``): the persistent tier is where real clusters keep
it, a shared file system or an object store, slower than the node's RAM. For each
bandwidth given, the bench mounts a throttled FUSE passthrough under ``--dir``
(``slowstore.py``: reads and writes share one link of that many MB/s), runs the
calibration and both layouts with the persistent run directory on it, and unmounts it.

Reported per layout (medians of ``--repeat`` runs): steps redone per failure (the last step
the killed process journaled, less the step its successor resumed at), the checkpoint
pause over the whole run (the training thread's time in saves and snapshots, waits
included, from the journal; and the same before the final save's wait, paid once a run),
from process start to the first step of each resumed process, and the time lost in all:
the pause, and per failure the steps redone and the restart. And the local tier's resume
against the raw read of its bytes: ``recovery.run.restoring.choose.load`` of the newest
snapshot the last killed process left (signature, every digest, decode) against reading
its files into memory (``bench_tiers_resume.py``, which also measures each way of hashing
on its own).
"""

from __future__ import annotations

import argparse
import json
import math
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
CALIBRATION_SAVES = 4


def worker(args: argparse.Namespace) -> None:
    """One training process: resume the newest verified step, train to ``--steps``;
    ``--calibrate``: wait for each save or snapshot before the next step (no overlap)."""
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
        every_steps=args.every,
        keep_last=2,
        async_save=args.async_save,
        local=local,
        hash=args.hash,
        shard_mb=args.shard_mb,
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
            if args.calibrate:
                ckpt.flush()


def _cmd(args: argparse.Namespace, work: Path, shm: Path, every: int, local: int) -> list[str]:
    cmd = [sys.executable, __file__, "--worker", "--dir", str(work), "--local-root", str(shm)]
    cmd += ["--size-mb", str(args.size_mb), "--step-ms", str(args.step_ms)]
    cmd += ["--every", str(every), "--local-every", str(local)]
    cmd += ["--hash", args.hash, "--shard-mb", str(args.shard_mb)]
    return cmd + (["--async"] if args.async_save else [])


def costs(records: list[dict[str, Any]]) -> dict[str, float]:
    """Medians of what a calibration run's journal says its saves cost: ``pause_s`` and
    ``write_s`` of its own saves (``checkpoint`` records not promoted), of its local
    snapshots (``snapshot``), and ``promote_write_s`` of its promotions."""
    saves = [r for r in records if r.get("event") == "checkpoint"]
    promoted = [r for r in saves if r.get("mode") == "promoted"]
    saves = [r for r in saves if r.get("mode") != "promoted"]
    snaps = [r for r in records if r.get("event") == "snapshot"]
    out: dict[str, float] = {}
    for name, recs in (("save", saves), ("snapshot", snaps)):
        if recs:
            out[f"{name}_pause_s"] = statistics.median(r["pause_s"] for r in recs)
            out[f"{name}_write_s"] = statistics.median(r["write_s"] for r in recs)
    if promoted:
        out["promote_write_s"] = statistics.median(r["write_s"] for r in promoted)
    return out


def calibrate(args: argparse.Namespace) -> dict[str, float]:
    """Each tier's costs on this machine: a one-tier and a two-tier run of
    :data:`CALIBRATION_SAVES` saves each, every save waited for (:func:`costs`)."""
    from recovery.run.journal import read

    measured: dict[str, float] = {}
    for every, local_every in ((2, 0), (4, 2)):  # one tier; two tiers (every 2nd promoted)
        work, shm = _dirs(args)
        cmd = [*_cmd(args, work, shm, every, local_every), "--calibrate"]
        cmd += ["--steps", str(2 * CALIBRATION_SAVES)]
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if done.returncode != 0:
            raise SystemExit(f"calibration failed: {done.stderr.decode()[-2000:]}")
        measured.update(costs(read(work / RUN / "metrics.jsonl")))
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    return measured


def choose(cal: dict[str, float], mtbf_s: float, step_s: float, host_loss: float) -> dict[str, Any]:
    """Each layout's best intervals, in steps of ``step_s`` seconds, and why.

    One tier: T = max(sqrt(2 C MTBF), W), C the pause of a persistent save, W its write.
    Two tiers, :func:`recovery.run.tiers.rules.plan` (a share ``host_loss`` of the failures
    assumed to take the node; none of the injected ones do): T_local = max(sqrt(2 C_local
    MTBF / (1 - h)), W_local); T_persistent = max(sqrt(2 C MTBF / h), W_local +
    W_promote), rounded up to a multiple of T_local (a promoted step is a snapshot step).
    """
    from recovery.run.tiers.rules import plan, young_daly

    def steps(seconds: float) -> int:
        return max(1, round(seconds / step_s))

    def floor(seconds: float) -> int:  # the fewest steps that take ``seconds``
        return max(1, math.ceil(seconds / step_s - 1e-9))

    one_yd = young_daly(cal["save_pause_s"], mtbf_s)
    every = max(steps(one_yd), floor(cal["save_write_s"]))
    p = plan(cal["save_pause_s"], cal["snapshot_pause_s"], mtbf_s, host_loss)
    local = max(steps(p["local_interval_s"]), floor(cal["snapshot_write_s"]))
    sustained = cal["snapshot_write_s"] + cal.get("promote_write_s", 0.0)
    every2 = max(steps(p["persistent_interval_s"]), floor(sustained), local)
    every2 = local * math.ceil(every2 / local)
    why = {
        "one": f"every {every} steps = max(Young/Daly sqrt(2 x C={cal['save_pause_s']:.3f}s x "
        f"MTBF={mtbf_s:.1f}s) = {one_yd:.2f}s -> {steps(one_yd)}, its write "
        f"{cal['save_write_s']:.2f}s -> {floor(cal['save_write_s'])})",
        "local": f"local every {local} steps = max(sqrt(2 x C_local="
        f"{cal['snapshot_pause_s']:.3f}s x MTBF/(1-h)) = {p['local_interval_s']:.2f}s -> "
        f"{steps(p['local_interval_s'])}, its write {cal['snapshot_write_s']:.2f}s -> "
        f"{floor(cal['snapshot_write_s'])})",
        "persistent": f"persistent every {every2} steps = max(sqrt(2 x C x MTBF/h) = "
        f"{p['persistent_interval_s']:.2f}s -> {steps(p['persistent_interval_s'])}, snapshot + "
        f"promotion write {sustained:.2f}s -> {floor(sustained)}), a multiple of {local}",
    }
    return {"every": every, "local_every": local, "every2": every2, "why": why, "plan": p}


def _dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    work = Path(tempfile.mkdtemp(prefix="bench-tiers-", dir=args.dir))
    return work, Path(tempfile.mkdtemp(prefix="bench-tiers-", dir=args.shm))


def run_layout(
    args: argparse.Namespace, kills: list[int], every: int, local_every: int
) -> dict[str, Any]:
    """The whole run under ``kills``; its costs as the journal recorded them."""
    from bench_tiers_resume import local_resume  # beside this file

    from recovery import faults
    from recovery.run.journal import read

    work, shm = _dirs(args)
    cmd = [*_cmd(args, work, shm, every, local_every), "--steps", str(args.steps)]
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
    result = summarise(read(work / RUN / "metrics.jsonl"), args.steps * args.step_ms / 1000.0)
    result.update({"every": every, "local_every": local_every, "wall_s": wall})
    if measured:
        result["local_resume"] = measured
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(shm, ignore_errors=True)
    return result


def summarise(records: list[dict[str, Any]], compute_s: float) -> dict[str, Any]:
    """Steps redone per failure, the checkpoint pause over the run and the restarts' time to
    their first step, from a run's journal (every process's records, in order)."""
    redone, steps, firsts, started = [], [0, 0], [], False
    for rec in records:  # each process journals its steps in order
        if rec.get("event") is None and isinstance(rec.get("step"), int):
            steps = [steps[-1], rec["step"]]
        # each process's first step follows its own first step's record: every process but
        # the first restarted from step - 1 (0: no checkpoint yet, a fresh start), after
        # the dead one journaled steps[0]
        if rec.get("event") == "first_step":
            if started:
                redone.append(steps[0] - (rec["step"] - 1))
            started = True
            if rec.get("resumed"):
                firsts.append(rec["seconds_since_process_start"])
    paused = [
        r
        for r in records
        if r.get("event") == "snapshot"
        or (r.get("event") == "checkpoint" and r.get("mode") != "promoted")
    ]
    # a save's wait for the one in flight (or a promotion's) held the training thread too
    waits = [r.get("wait_s", 0.0) for r in records if r.get("event") == "checkpoint"]
    pause = sum(r["pause_s"] for r in paused) + sum(waits)
    # the final save's wait for the write in flight is paid once a run, not once an interval
    # (and on a slow store it is most of a write: a run of a few intervals is dominated by it)
    end_wait = waits[-1] if waits else 0.0
    return {
        "redone_per_failure": statistics.mean(redone) if redone else 0.0,
        "redone": redone,
        "checkpoint_pause_s": pause,
        "end_wait_s": end_wait,
        "pause_before_end_s": pause - end_wait,
        "overhead_vs_compute": pause / compute_s,
        "pauses": len(paused),
        "skipped": sum(r.get("skipped", 0) for r in records if r.get("event") == "snapshot"),
        "restart_to_first_step_s": statistics.median(firsts) if firsts else None,
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each figure over repeated runs of one layout (lists kept per run)."""
    out: dict[str, Any] = {k: v for k, v in runs[0].items() if isinstance(v, int | str)}
    keys = ("redone_per_failure", "checkpoint_pause_s", "overhead_vs_compute", "wall_s")
    for key in (*keys, "end_wait_s", "pause_before_end_s"):
        out[key] = statistics.median(r[key] for r in runs)
    firsts = [r["restart_to_first_step_s"] for r in runs if r["restart_to_first_step_s"]]
    out["restart_to_first_step_s"] = statistics.median(firsts) if firsts else None
    out["runs"] = runs
    resumes = [r["local_resume"] for r in runs if r.get("local_resume")]
    if resumes:
        out["local_resume"] = {
            k: statistics.median(m[k] for m in resumes) for k in ("raw_read_s", "verified_load_s")
        }
        out["local_resume"]["ratio"] = statistics.median(m["ratio"] for m in resumes)
    return out


def intervals(args: argparse.Namespace, out: dict[str, Any]) -> tuple[int, int, int]:
    """(one tier's, two tiers' local, two tiers' persistent) intervals in steps: given, or
    chosen from a calibration pass (printed, and recorded in ``out``)."""
    if args.every is not None or args.local_every is not None:
        if args.every is None or args.local_every is None:
            raise SystemExit("--every and --local-every: give both (or neither, to calibrate)")
        out["intervals"] = {"given": True, "every": args.every, "local_every": args.local_every}
        print(f"intervals given: persistent every {args.every}, local every {args.local_every}")
        return args.every, args.local_every, args.every
    cal = calibrate(args)
    compute = args.steps * args.step_ms / 1000.0
    mtbf = compute / args.kills
    chosen = choose(cal, mtbf, args.step_ms / 1000.0, args.host_loss)
    out["calibration"], out["mtbf_s"], out["intervals"] = cal, mtbf, chosen
    print(
        "calibration: persistent save pause {save_pause_s:.3f} s, write {save_write_s:.3f} s; "
        "local snapshot pause {snapshot_pause_s:.3f} s, write {snapshot_write_s:.3f} s; "
        "promotion write {promote_write_s:.3f} s".format(**cal)
    )
    print(f"MTBF {mtbf:.1f} s = {compute:.1f} s compute / {args.kills} kills, h {args.host_loss}")
    print(f" one tier: {chosen['why']['one']}")
    print(f"two tiers: {chosen['why']['local']};\n           {chosen['why']['persistent']}")
    return chosen["every"], chosen["local_every"], chosen["every2"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--calibrate", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    p.add_argument("--shm", type=Path, default=Path("/dev/shm"))
    p.add_argument("--local-root", type=Path, default=Path(f"/dev/shm/recovery-{os.geteuid()}"))
    p.add_argument("--size-mb", type=float, default=256.0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--step-ms", type=float, default=50.0)
    p.add_argument("--kills", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=int, help="persistent interval (steps); default: calibrated")
    p.add_argument("--local-every", type=int, help="local interval (steps); default: calibrated")
    p.add_argument("--host-loss", type=float, default=0.1, help="h of recovery plan --host-loss")
    p.add_argument("--async", dest="async_save", action="store_true")
    p.add_argument("--hash", default="sha256", choices=("sha256", "blake3"))
    p.add_argument("--shard-mb", type=float, default=256.0, help="checkpoint.shard_mb")
    p.add_argument("--repeat", type=int, default=1, help="runs of each layout (medians)")
    p.add_argument(
        "--layouts", default="one,two", help="which to run: one,two (the comparison), or one"
    )
    p.add_argument(
        "--store-mbps",
        default=None,
        help="comma-separated bandwidths (MB/s): the persistent tier on a slow store of each "
        "(a throttled FUSE mount under --dir, benchmarks/slowstore.py), one comparison each",
    )
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    args.dir.mkdir(parents=True, exist_ok=True)
    args.shm.mkdir(parents=True, exist_ok=True)
    kills = sorted(random.Random(args.seed).sample(range(2, args.steps), args.kills))
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "kills": kills}
    if args.store_mbps is None:
        out.update(compare(args, kills))
    else:
        out["stores"] = on_slow_stores(args, kills, [float(x) for x in args.store_mbps.split(",")])
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


def on_slow_stores(
    args: argparse.Namespace, kills: list[int], bandwidths: list[float]
) -> dict[str, Any]:
    """:func:`compare` with the persistent tier on a slow store of each bandwidth, mounted
    (and unmounted) here."""
    import slowstore  # beside this file

    lacking = slowstore.missing()
    if lacking is not None:
        raise SystemExit(f"--store-mbps needs {lacking}")
    out: dict[str, Any] = {}
    home = Path(tempfile.mkdtemp(prefix="bench-tiers-store-", dir=args.dir))
    try:
        for mbps in bandwidths:
            print(f"\n== persistent tier on a slow store of {mbps:g} MB/s ==", flush=True)
            backing, mount = home / f"backing-{mbps:g}", home / f"mount-{mbps:g}"
            with slowstore.mounted(backing, mount, mbps):
                on_store = argparse.Namespace(**{**vars(args), "dir": mount})
                out[f"{mbps:g}"] = {"store_mbps": mbps, **compare(on_store, kills)}
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return out


def compare(args: argparse.Namespace, kills: list[int]) -> dict[str, Any]:
    """Choose the intervals, run each layout ``--repeat`` times, report; the record."""
    out: dict[str, Any] = {"load_average_before": os.getloadavg()}
    every, local_every, every2 = intervals(args, out)
    layouts = {"one": ("one tier", every, 0), "two": ("two tiers", every2, local_every)}
    chosen = [layouts[name] for name in args.layouts.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in chosen}
    for _ in range(args.repeat):  # alternated, so that a change of load hits both
        for name, persistent, local in chosen:
            runs[name].append(run_layout(args, kills, persistent, local))
    results = {name: median_of(rs) for name, rs in runs.items()}
    out["load_average_after"] = os.getloadavg()
    out.update({name.replace(" ", "_"): r for name, r in results.items()})
    for r in results.values():  # what the failures and the checkpoints cost the run in all
        r["time_lost_s"] = time_lost(r, len(kills), args.step_ms / 1000.0)
    report(out, results, kills)
    return out


def time_lost(result: dict[str, Any], kills: int, step_s: float) -> float:
    """Seconds a layout's run lost in all: its checkpoint pause, and per failure the steps
    it redid and its restart to the first step."""
    restart = result["restart_to_first_step_s"] or 0.0
    return float(
        result["checkpoint_pause_s"] + kills * (result["redone_per_failure"] * step_s + restart)
    )


def report(out: dict[str, Any], results: dict[str, dict[str, Any]], kills: list[int]) -> None:
    """Print each layout's medians and the comparison (and record it in ``out``)."""
    one, two = results.get("one tier"), results.get("two tiers")
    if one is not None and two is not None:  # None: two tiers redid nothing
        lost = two["redone_per_failure"]
        out["fewer_redone"] = one["redone_per_failure"] / lost if lost else None
        pause = one["checkpoint_pause_s"]
        out["pause_ratio"] = two["checkpoint_pause_s"] / pause if pause else None
        before = one["pause_before_end_s"]
        out["pause_before_end_ratio"] = two["pause_before_end_s"] / before if before else None
    print(f"kills at steps {kills}; load average {out['load_average_before'][0]:.2f} before")
    for name, r in results.items():
        redone = [x["redone"] for x in r["runs"]]
        print(
            f"{name:>9}: {r['redone_per_failure']:.1f} steps redone per failure {redone}, "
            f"checkpoint pause {r['checkpoint_pause_s']:.2f} s "
            f"({r['overhead_vs_compute']:.1%} of compute; before the final save's wait "
            f"{r['pause_before_end_s']:.2f} s), restart to first step "
            f"{r['restart_to_first_step_s'] or 0:.2f} s; lost in all {r['time_lost_s']:.1f} s"
        )
    if out.get("fewer_redone") is not None:
        print(
            f"{out['fewer_redone']:.1f}x fewer steps redone per failure with two tiers, "
            f"{out['pause_ratio']:.2f}x the checkpoint pause "
            f"({out['pause_before_end_ratio'] or 0:.2f}x before the final save's wait)"
        )
    elif "fewer_redone" in out:
        print("no step redone with two tiers")
    if two is not None and two.get("local_resume"):
        lr = two["local_resume"]
        print(
            f"local resume: verified load {lr['verified_load_s']:.3f} s, raw read "
            f"{lr['raw_read_s']:.3f} s ({lr['ratio']:.2f}x)"
        )


if __name__ == "__main__":
    main()
