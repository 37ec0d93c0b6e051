"""Measure mid-epoch SIGKILL resume and kill-during-save behaviour of the two loops here.

Every run is a real child process (its own session/process group); a "kill" is SIGKILL to that
process group (trainer + its DataLoader workers), sent by this script.

Experiments
  resume:  per variant, an uninterrupted reference run, a second uninterrupted run (determinism
           control), and runs SIGKILLed right after step K (K in --kill-steps) and then restarted
           with the same command. Per-step losses (last record of a step wins) and the final
           parameters are compared bitwise with the reference.
  save:    a larger model (~50 MB checkpoint). The run is SIGKILLed a chosen delay after the
           directory of its 2nd checkpoint appears; the delays sweep 0 .. 1.25x the measured save
           time. What is on disk is recorded, then the same command is restarted (twice if the
           first restart fails) and its exit code / exception / chosen checkpoint are recorded.

Usage:
    /tmp/cmpvenv/bin/python run_compare.py [--out /tmp/compare_resume_runs] [--attempts 20]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata as md
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable
N_POINTS, BATCH = 512, 16  # must match the loops
LOOPS = {"dcp": "dcp_loop.py", "accelerate": "accelerate_loop.py"}

# (tool, variant name, extra args). The first variant of each tool is the "as documented" one.
RESUME_VARIANTS = [
    ("dcp", "documented (dataset saves worker RNG, torchdata tutorial)", []),
    ("dcp", "no dataset state_dict (worker RNG not saved)", ["--no-worker-rng-state"]),
    ("dcp", "diagnostic: no augmentation", ["--no-worker-rng-state", "--no-aug"]),
    ("accelerate", "documented (plain DataLoader)", []),
    ("accelerate", "diagnostic: no augmentation", ["--no-aug"]),
    ("accelerate", "diagnostic: use_seedable_sampler=True", ["--seedable-sampler"]),
    ("accelerate", "diagnostic: seeded DataLoader generator", ["--loader-generator"]),
    (
        "accelerate",
        "diagnostic: seeded DataLoader generator, no augmentation",
        ["--loader-generator", "--no-aug"],
    ),
    (
        "accelerate",
        "diagnostic: use_seedable_sampler=True, no augmentation",
        ["--seedable-sampler", "--no-aug"],
    ),
]


# ----------------------------------------------------------------------------- process helpers
def cmd_for(tool: str, workdir: str, log: str, extra: list[str], common: list[str]) -> list[str]:
    return [
        PY,
        os.path.join(HERE, LOOPS[tool]),
        "--workdir",
        workdir,
        "--log",
        log,
        *common,
        *extra,
    ]


def launch(cmd: list[str], workdir: str, tag: str, nice: int = 0) -> subprocess.Popen:
    out = open(os.path.join(workdir, f"{tag}.stdout"), "w")  # noqa: SIM115 (child keeps it)
    err = open(os.path.join(workdir, f"{tag}.stderr"), "w")  # noqa: SIM115
    pre = (lambda: os.nice(nice)) if nice else None
    return subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True, preexec_fn=pre)


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group this script created for the child
    proc.wait()


def run_to_end(cmd, workdir, tag, timeout=600) -> int:
    proc = launch(cmd, workdir, tag)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return -999


def read_log(path: str):
    steps, events = {}, []
    if not os.path.exists(path):
        return steps, events
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # torn last line after SIGKILL
                continue
            if "step" in rec and "loss" in rec:
                steps[rec["step"]] = rec  # last record of a step wins
            else:
                events.append(rec)
    return steps, events


def run_kill_after_step(cmd, workdir, log, tag, kill_step, timeout=300) -> dict:
    # The trainer runs at nice 5 so that this watcher (2 CPUs, 3 busy trainer processes) gets
    # scheduled promptly and the kill lands right after `kill_step`, not a few steps later.
    proc = launch(cmd, workdir, tag, nice=5)
    t0 = time.time()
    pos, buf, last_seen = 0, "", 0
    while True:
        if os.path.exists(log):
            with open(log) as f:
                f.seek(pos)
                chunk = f.read()
                pos = f.tell()
            buf += chunk
            *lines, buf = buf.split("\n")
            for line in lines:
                with contextlib.suppress(json.JSONDecodeError):
                    last_seen = max(last_seen, json.loads(line).get("step", 0))
        if last_seen >= kill_step:
            kill_group(proc)
            steps, _ = read_log(log)
            return {"killed": True, "last_logged_step_at_kill": max(steps)}
        if proc.poll() is not None:
            return {"killed": False, "rc": proc.returncode}
        if time.time() - t0 > timeout:
            kill_group(proc)
            return {"killed": False, "rc": "timeout"}
        time.sleep(0.002)


def last_exception(stderr_path: str) -> str | None:
    with open(stderr_path) as f:
        text = f.read()
    if "Traceback" not in text:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", ln):
            return ln[:300]
    return lines[-1][:300]


def epoch_coverage(steps: dict, steps_per_epoch: int) -> list[dict]:
    """For each complete epoch in the (last-record-wins) log: samples seen twice / never."""
    out = []
    n_ep = max(steps) // steps_per_epoch if steps else 0
    for e in range(n_ep):
        seen = []
        for s in range(e * steps_per_epoch + 1, (e + 1) * steps_per_epoch + 1):
            seen += steps.get(s, {}).get("idx", [])
        distinct = len(set(seen))
        out.append(
            {
                "epoch": e,
                "samples": len(seen),
                "repeated": len(seen) - distinct,
                "never_seen": N_POINTS - distinct,
            }
        )
    return out


def compare(ref_dir: str, test_dir: str, steps_per_epoch: int = N_POINTS // BATCH) -> dict:
    import torch

    ref_steps, _ = read_log(os.path.join(ref_dir, "log.jsonl"))
    got_steps, _ = read_log(os.path.join(test_dir, "log.jsonl"))
    differing = [
        s
        for s in sorted(ref_steps)
        if s not in got_steps
        or got_steps[s]["loss"] != ref_steps[s]["loss"]
        or got_steps[s]["lr"] != ref_steps[s]["lr"]
    ]

    def first(key):
        bad = [
            s
            for s in sorted(ref_steps)
            if s not in got_steps or got_steps[s].get(key) != ref_steps[s].get(key)
        ]
        return bad[0] if bad else None

    res = {
        "steps_compared": len(ref_steps),
        "first_differing_step": differing[0] if differing else None,
        "n_differing_steps": len(differing),
        "params_bitwise_equal": None,
        # diagnostics: which sample indices each step trained on / the augmented inputs
        "first_step_other_samples": first("idx"),
        "first_step_other_inputs": first("xsum"),
        "epoch_coverage": epoch_coverage(got_steps, steps_per_epoch),
    }
    a, b = os.path.join(ref_dir, "final_params.pt"), os.path.join(test_dir, "final_params.pt")
    if os.path.exists(a) and os.path.exists(b):
        pa, pb = torch.load(a), torch.load(b)
        res["params_bitwise_equal"] = pa.keys() == pb.keys() and all(
            torch.equal(pa[k], pb[k]) for k in pa
        )
    return res


def fresh(path: str) -> str:
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


# ----------------------------------------------------------------------------- experiments
def resume_experiment(out: str, steps: int, every: int, kill_steps: list[int]) -> list[dict]:
    common = ["--steps", str(steps), "--ckpt-every", str(every)]
    rows = []
    for i, (tool, name, extra) in enumerate(RESUME_VARIANTS):
        base = os.path.join(out, "resume", f"{i}_{tool}")
        ref = fresh(os.path.join(base, "reference"))
        rc = run_to_end(
            cmd_for(tool, ref, os.path.join(ref, "log.jsonl"), extra, common), ref, "run"
        )
        ctl = fresh(os.path.join(base, "control"))
        rc2 = run_to_end(
            cmd_for(tool, ctl, os.path.join(ctl, "log.jsonl"), extra, common), ctl, "run"
        )
        row = {
            "tool": tool,
            "variant": name,
            "args": extra,
            "reference_rc": rc,
            "control_rc": rc2,
            "control_vs_reference": compare(ref, ctl),
            "kills": [],
        }
        for k in kill_steps:
            d = fresh(os.path.join(base, f"kill_after_{k}"))
            log = os.path.join(d, "log.jsonl")
            cmd = cmd_for(tool, d, log, extra, common)
            kinfo = run_kill_after_step(cmd, d, log, "run1", k)
            rc_re = run_to_end(cmd, d, "run2")
            _, events = read_log(log)
            resumes = [e for e in events if e.get("event") == "resume"]
            row["kills"].append(
                {
                    "kill_after_step": k,
                    **kinfo,
                    "restart_rc": rc_re,
                    "restart_exception": last_exception(os.path.join(d, "run2.stderr")),
                    "resumed_from": resumes[-1] if resumes else None,
                    **compare(ref, d),
                }
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def naive_iteration_experiment(out: str, steps: int, every: int) -> dict:
    """Accelerate restart without re-syncing project_configuration.iteration."""
    common = ["--steps", str(steps), "--ckpt-every", str(every)]
    d = fresh(os.path.join(out, "accelerate_naive_iteration"))
    log = os.path.join(d, "log.jsonl")
    cmd = cmd_for("accelerate", d, log, ["--naive-iteration"], common)
    kinfo = run_kill_after_step(cmd, d, log, "run1", 25)
    rc = run_to_end(cmd, d, "run2")
    steps_seen, events = read_log(log)
    res = {
        "kill": kinfo,
        "restart_rc": rc,
        "restart_exception": last_exception(os.path.join(d, "run2.stderr")),
        "events": events[-3:],
        "max_step_logged": max(steps_seen) if steps_seen else None,
    }
    print(json.dumps(res), flush=True)
    return res


def dir_listing(path: str) -> dict:
    if not os.path.isdir(path):
        return {}
    return {n: os.path.getsize(os.path.join(path, n)) for n in sorted(os.listdir(path))}


SAVE_TARGET = {"dcp": ("ckpt", "step_000020"), "accelerate": ("checkpoints", "checkpoint_1")}
# files whose size legitimately differs between runs (DCP's .metadata embeds the checkpoint path;
# it is written to .metadata.tmp and renamed, so its presence means it is complete)
SIZE_EXEMPT = {"dcp": {".metadata"}, "accelerate": set()}
# "kill as soon as this file shows up in the checkpoint dir" triggers, in each tool's write order
FILE_TRIGGERS = {
    "dcp": ["__0_0.distcp", ".metadata.tmp", ".metadata"],
    "accelerate": [
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.pkl",
        "custom_checkpoint_0.pkl",
        "custom_checkpoint_1.pkl",
    ],
}


def save_kill_attempt(tool, d, cmd, ref, ref_files, trigger) -> dict:
    """Start the loop, SIGKILL it during its 2nd save according to `trigger`, restart it."""
    root, target = SAVE_TARGET[tool]
    log = os.path.join(d, "log.jsonl")
    proc = launch(cmd, d, "run1")
    tdir = os.path.join(d, root, target)
    while not os.path.isdir(tdir) and proc.poll() is None:
        time.sleep(0.0005)
    kind, value = trigger
    if kind == "delay" and value:
        time.sleep(value)
    elif kind == "file":
        t0 = time.time()
        while (
            not os.path.exists(os.path.join(tdir, value))
            and proc.poll() is None
            and time.time() - t0 < 30
        ):
            time.sleep(0.0002)
    kill_group(proc)
    on_disk = dir_listing(tdir)
    exempt = SIZE_EXEMPT[tool]
    missing = sorted(set(ref_files) - set(on_disk))
    short = sorted(
        n for n in on_disk if n in ref_files and n not in exempt and on_disk[n] != ref_files[n]
    )
    extra = sorted(set(on_disk) - set(ref_files))
    complete = not missing and not short and not extra
    restarts = []
    for r in (1, 2):  # a second restart only if the first one failed: is the failure sticky?
        rc = run_to_end(cmd, d, f"run{r + 1}")
        _, events = read_log(log)
        resumes = [e for e in events if e.get("event") == "resume"]
        restarts.append(
            {
                "rc": rc,
                "exception": last_exception(os.path.join(d, f"run{r + 1}.stderr")),
                "resumed_from": resumes[-1]["dir"] if resumes and rc == 0 else None,
            }
        )
        if rc == 0:
            break
    return {
        "trigger": f"{kind}={value}",
        "target_complete": complete,
        "missing": missing,
        "truncated": short,
        "extra_files": extra,
        "on_disk": on_disk,
        "checkpoint_dirs": sorted(os.listdir(os.path.join(d, root))),
        "restarts": restarts,
        "vs_reference": compare(ref, d) if restarts[-1]["rc"] == 0 else None,
    }


def save_kill_experiment(out: str, attempts: int, hidden: int, file_repeats: int) -> dict:
    steps, every = 30, 10
    common = ["--steps", str(steps), "--ckpt-every", str(every), "--hidden", str(hidden)]
    result = {}
    for tool in ("dcp", "accelerate"):
        base = os.path.join(out, "savekill", tool)
        ref = fresh(os.path.join(base, "reference"))
        run_to_end(cmd_for(tool, ref, os.path.join(ref, "log.jsonl"), [], common), ref, "run")
        _, ev = read_log(os.path.join(ref, "log.jsonl"))
        save_secs = [e["seconds"] for e in ev if e.get("event") == "saved"]
        root, target = SAVE_TARGET[tool]
        ref_files = dir_listing(os.path.join(ref, root, target))
        t_save = max(save_secs)
        triggers = [
            ("delay", round(t_save * 1.25 * i / max(1, attempts - 1), 4)) for i in range(attempts)
        ]
        triggers += [("file", name) for name in FILE_TRIGGERS[tool] for _ in range(file_repeats)]
        rows = []
        for j, trig in enumerate(triggers):
            d = fresh(os.path.join(base, f"attempt_{j:02d}"))
            row = {
                "attempt": j,
                **save_kill_attempt(
                    tool,
                    d,
                    cmd_for(tool, d, os.path.join(d, "log.jsonl"), [], common),
                    ref,
                    ref_files,
                    trig,
                ),
            }
            rows.append(row)
            print(
                json.dumps(
                    {
                        k: row[k]
                        for k in (
                            "attempt",
                            "trigger",
                            "target_complete",
                            "missing",
                            "truncated",
                            "extra_files",
                            "restarts",
                        )
                    }
                ),
                flush=True,
            )
        result[tool] = {
            "reference_save_seconds": save_secs,
            "reference_files": ref_files,
            "target": f"{root}/{target}",
            "attempts": rows,
        }
    return result


def count_ckpt_lines() -> dict:
    res = {}
    for tool, fn in LOOPS.items():
        with open(os.path.join(HERE, fn)) as f:
            lines = f.read().splitlines()
        marked = [ln for ln in lines if "# ckpt" in ln]
        res[tool] = {
            "marked_lines": len(marked),
            "of_which_worker_rng": sum("# ckpt worker-rng" in ln for ln in marked),
        }
    return res


def versions() -> dict:
    v = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
    }
    for pkg in ("torch", "torchdata", "accelerate", "numpy", "safetensors"):
        try:
            v[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            v[pkg] = None
    return v


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="/tmp/compare_resume_runs")
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--kill-steps", default="25,45")
    p.add_argument("--attempts", type=int, default=20)
    p.add_argument("--hidden-big", type=int, default=2048)
    p.add_argument("--file-repeats", type=int, default=3)
    p.add_argument("--only", choices=["resume", "save", "all"], default="all")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = {"versions": versions(), "ckpt_lines": count_ckpt_lines(), "settings": vars(args)}
    print(json.dumps(results), flush=True)
    if args.only in ("resume", "all"):
        kills = [int(k) for k in args.kill_steps.split(",")]
        results["resume"] = resume_experiment(args.out, args.steps, args.ckpt_every, kills)
        results["accelerate_naive_iteration"] = naive_iteration_experiment(
            args.out, args.steps, args.ckpt_every
        )
    if args.only in ("save", "all"):
        results["save_kill"] = save_kill_experiment(
            args.out, args.attempts, args.hidden_big, args.file_repeats
        )
    with open(os.path.join(args.out, f"results_{args.only}.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("wrote", os.path.join(args.out, f"results_{args.only}.json"))


if __name__ == "__main__":
    main()
