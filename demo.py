"""``make demo``: train, get preempted (a real SIGKILL), resume, prove it, export, serve, audit.

Runs real processes on the embedded defaults and narrates:
0. ``dvc repro prepare``: the interaction log;
1. an uninterrupted reference run;
2. the run ``default`` started with the requeue-safe ``+resume=latest``, killed with
   SIGKILL between two checkpoints (a preemption);
3. the same command again, which resumes from the newest verified checkpoint;
4. every step's loss, lr and batch and the final parameters compared bit for bit;
5. ``recovery ls`` / ``verify`` / ``audit``: signed checkpoints, provenance, lineage;
6. the same run with async saves at the auto interval, and what checkpointing cost;
7. ``dvc repro``: the export stage turns the newest checkpoint into a signed
   inference artifact, ``recovery predict`` serves raw ids with it (one unknown),
   and ``recovery audit`` walks from the artifact back to the run's start.

What it leaves, and where (a second demo starts over): scratch runs and inputs under
``.demo/``; the main run ``checkpoints/default`` (the run ``dvc.yaml`` exports), which
the demo only replaces if it made it; the data ``data/interactions`` and the artifact
``artifacts/default``, the pipeline's outputs in DVC's cache; the dev signing key under
``.recovery/``. All of it is git-ignored: the demo's runs are not registered with DVC
(``checkpoint.dvc.enabled=false``, which says where checkpoints are kept, not what run it
is: a later resume with DVC on reports no drift), so they leave no ``.dvc`` files to
commit. ``git status`` shows one change, ``dvc.lock``, where ``dvc repro`` recorded this
machine's export, so that ``dvc status`` says the pipeline is up to date.

``RECOVERY_DEMO_STEPS=N`` (N >= 12; default 1200) runs the same steps and commands
with N training steps, a checkpoint every N/6 and the kill after 3.5 checkpoints,
passed as ``train.steps=`` and ``checkpoint.every_steps=`` overrides: a quick demo
(the tests run it this way).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from recovery import faults
from recovery.cli import parameters_digest
from recovery.config import SigningConfig
from recovery.format.layout import METRICS_FILE, scan, step_dir_name
from recovery.integrity.keys import trust
from recovery.run.journal import effective_steps, read
from recovery.run.restoring import choose

HERE = Path(__file__).resolve().parent
DEMO = HERE / ".demo"
MAIN = HERE / "checkpoints" / "default"
MARKER = MAIN / ".made-by-demo"
PLACEHOLDER = MAIN / "README.md"  # tracked: the export stage's dependency exists in a clone
DEFAULT_STEPS = 1200
STEPS_ENV = "RECOVERY_DEMO_STEPS"
# the commands run this checkout's code (train.py's own directory is first on its
# sys.path anyway; the console scripts and DVC's stage commands need PYTHONPATH); one
# torch thread unless told otherwise: the model is tiny, and a pool of spinning threads
# more than doubled the demo's CPU time on 2 cores (171 s -> 70 s)
ENV = {
    **os.environ,
    "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    "PYTHONPATH": os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p),
    "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
}


def sizes() -> tuple[int, int, int, list[str]]:
    """``(steps, checkpoint every, kill after, overrides)`` from ``RECOVERY_DEMO_STEPS``."""
    raw = os.environ.get(STEPS_ENV, str(DEFAULT_STEPS))
    if not raw.isdigit() or int(raw) < 12:
        raise SystemExit(f"{STEPS_ENV}={raw!r}: expected a whole number of steps >= 12")
    steps = int(raw)
    every = steps // 6
    # the default is the embedded config's (train.steps=1200, checkpoint.every_steps=200)
    quick = [f"train.steps={steps}", f"checkpoint.every_steps={every}"]
    overrides = [] if steps == DEFAULT_STEPS else quick
    return steps, every, 3 * every + every // 2, overrides


def say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def run(*cmd: str) -> int:
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.call(list(cmd), cwd=HERE, env=ENV)


def train(*overrides: str, kill_at: int | None = None) -> int:
    cmd = [sys.executable, str(HERE / "train.py"), *overrides]
    print("$ " + " ".join(["python", "train.py", *overrides]), flush=True)
    env = dict(ENV)
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


def rel(path: Path) -> str:
    """``path`` as the user pastes it: relative to the project root, where the commands run."""
    return os.path.relpath(path, HERE)


def fresh_start() -> None:
    held = [p for p in MAIN.iterdir() if p not in (PLACEHOLDER, MARKER)] if MAIN.exists() else []
    if held and not MARKER.exists():
        raise SystemExit(
            f"{rel(MAIN)} holds a run the demo did not make; move it away (or run the demo "
            "in a fresh clone) so that it is not overwritten"
        )
    for entry in held:  # the placeholder git keeps for dvc.yaml's export stage stays
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    MAIN.mkdir(parents=True, exist_ok=True)
    MARKER.touch()


def main() -> int:
    return demo()


def demo() -> int:
    steps, every, kill_at, size = sizes()
    fresh_start()
    t0 = time.time()
    # no run of the demo registers its checkpoints with DVC: a registered checkpoint's
    # .dvc file is for git (DVC refuses a git-ignored one), and the demo's runs are not
    # yours to version
    off = "checkpoint.dvc.enabled=false"
    scratch = [f"checkpoint.root={rel(DEMO)}", off, *size]

    say("0. The data: the pipeline's prepare stage (its DVC hash is the dataset version)")
    if run("dvc", "repro", "prepare") != 0:
        return 1

    say(f"1. Reference: an uninterrupted run of {steps} steps")
    if train(*scratch, "run.name=reference") != 0:
        return 1

    say(f"2. The run, preempted with SIGKILL after step {kill_at} (checkpoints every {every})")
    main_run = ["+resume=latest", off, *size]
    rc = train(*main_run, kill_at=kill_at)
    print(f"--> process ended by signal {-rc}; what survived on disk:", flush=True)
    run("recovery", "ls", rel(MAIN))

    say("3. Requeued with the same command line: it resumes from the newest verified checkpoint")
    if train(*main_run) != 0:
        return 1

    say("4. Is the resumed run the same run? Every step's loss, lr and batch, and the final state")
    ref = effective_steps(DEMO / "reference" / METRICS_FILE)
    got = effective_steps(MAIN / METRICS_FILE)
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
    a = choose.load(DEMO / "reference" / step_dir_name(steps), keys).decoded
    b = choose.load(MAIN / step_dir_name(steps), keys).decoded
    pa, pb = parameters_digest(a.tree["model"]), parameters_digest(b.tree["model"])
    print(f"steps compared:          {len(ref)} (loss, lr, epoch, batch ids)")
    print(f"differences:             {len(diffs)}")
    print(f"first loss -> last loss: {ref[1]['loss']:.4f} -> {ref[steps]['loss']:.4f}")
    print(f"reference parameters:    sha256 {pa}")
    print(f"resumed parameters:      sha256 {pb}")
    same = not diffs and pa == pb
    print("verdict:                 " + ("BIT-IDENTICAL" if same else f"DIFFERENT at {diffs[:3]}"))

    say("5. The resumed run's checkpoints: hashes, signature, signer's trust, provenance")
    run("recovery", "ls", rel(MAIN))
    newest = scan(MAIN).committed[-1][1]
    rc = run("recovery", "verify", rel(newest))
    rc = rc or run("recovery", "audit", rel(newest))

    say("6. The same run with async saves at the auto (Young/Daly) interval: what it cost")
    if train(*scratch, "run.name=auto", "checkpoint.async=true", "checkpoint.interval=auto") != 0:
        return 1
    events = read(DEMO / "auto" / METRICS_FILE)
    summary = next(r for r in events if r.get("event") == "run_summary")
    saves = [r for r in events if r.get("event") == "checkpoint"]
    auto = choose.load(DEMO / "auto" / step_dir_name(steps), keys).decoded
    same_auto = parameters_digest(auto.tree["model"]) == pa
    interval = summary["interval"].get("seconds") or 0.0
    pause_ms = sorted(r["pause_s"] for r in saves)[len(saves) // 2] * 1e3
    print(f"checkpoints written:     {len(saves)} (auto interval {interval:.1f} s)")
    print(f"training pause, median:  {pause_ms:.2f} ms")
    print(f"checkpoint overhead:     {summary['checkpoint_fraction'] * 100:.2f}% of run time")
    print("final parameters:        " + ("identical" if same_auto else "DIFFERENT"))
    same = same and same_auto

    say("7. dvc repro: export the newest checkpoint as a signed inference artifact, serve, audit")
    rc = rc or run("dvc", "repro")
    artifact = HERE / "artifacts" / "default"
    requests = DEMO / "requests.jsonl"
    ids = _some_ids()
    requests.write_text(
        "".join(json.dumps({"user_id": u, "item_id": i}) + "\n" for u, i in ids)
        + json.dumps({"user_id": 1, "item_id": ids[0][1]})
        + "\n"
    )
    rc = rc or run("recovery", "predict", rel(artifact), "--input", rel(requests))
    rc = rc or run("recovery", "audit", rel(artifact))
    print(
        f"\ndemo finished in {time.time() - t0:.1f}s; the run is in {rel(MAIN)}, scratch in "
        f"{rel(DEMO)}; dvc.lock records this machine's export (`dvc status`: up to date)"
    )
    print(
        "a run of your own registers each checkpoint with DVC (checkpoint.dvc.enabled, "
        "on by default): git add its .dvc files to version it"
    )
    return 0 if same and rc == 0 else 1


def _some_ids() -> list[tuple[int, int]]:
    import safetensors.numpy

    table = safetensors.numpy.load_file(str(HERE / "data" / "interactions" / "ids.safetensors"))
    return [(int(table["user_id"][k]), int(table["item_id"][k])) for k in (0, 7, 42)]


if __name__ == "__main__":
    sys.exit(main())
