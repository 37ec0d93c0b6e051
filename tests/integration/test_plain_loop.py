"""examples/plain_loop.py, the docs' own-loop page: SIGKILLed, rerun, resumed exactly."""

from __future__ import annotations

import os
import re
import signal
import sys
from pathlib import Path

import pytest
import torch

from recovery.format.layout import step_dir_name
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.journal import effective_steps, read
from recovery.run.restoring import choose
from recovery.tools.drill import flat_tensors
from tests import launcher
from tests.integration.conftest import run_killed_at

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "plain_loop.py"
OWN_LOOP = (ROOT / "docs" / "own-loop.md").read_text()

# what an install of the core alone lacks: the script must not need any of it
BLOCK = """
import importlib.abc, importlib.machinery, runpy, sys
class Absent(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    # found (probes such as torch's find_spec see a spec), but importing it fails as absent
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"dvc", "hydra", "omegaconf", "matplotlib", "sklearn"}:
            return importlib.machinery.ModuleSpec(name, self, origin="absent")
    def create_module(self, spec):
        raise ModuleNotFoundError(f"No module named {spec.name!r} (not in the core install)")
sys.meta_path.insert(0, Absent())
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def test_the_docs_own_loop_page_shows_the_example_file() -> None:
    # the page's first python block (its fence carries a title saying it is this file)
    block = re.split(r"^```python[^\n]*\n", OWN_LOOP, maxsplit=1, flags=re.M)[1].split("```", 1)[0]
    assert block == SCRIPT.read_text()


def train(run_dir: Path, *args: str, pause_at: str | None = None) -> tuple[int, str]:
    """Run the example as a user would (core install only); SIGKILL it at ``pause_at``."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    cmd = [sys.executable, "-c", BLOCK, str(SCRIPT), "--run-dir", str(run_dir), *args]
    # the core profile: the optional dependencies are not preloaded, so BLOCK can hide them
    return run_killed_at(cmd, env=env, cwd=run_dir.parent, pause_at=pause_at, profile="core")


def final_tensors(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    tree = choose.load(run_dir / step_dir_name(step), TrustStore([]), allow_untrusted=True)
    return flat_tensors({k: tree.decoded.tree[k] for k in ("model", "optimizer")})


@pytest.mark.parametrize(
    ("args", "kills"),
    [
        ((), ["commit-before-rename-20", "commit-write-40"]),
        (
            ("--amp", "--steps", "24", "--accum", "3", "--workers", "1"),
            ["commit-before-manifest-20"],
        ),
        (("--persistent", "--steps", "40"), ["step-21", "commit-write-30"]),
    ],
    ids=["workers-accumulation", "amp", "persistent-workers"],
)
def test_killed_and_rerun_it_trains_the_uninterrupted_run_bit_for_bit(
    tmp_path: Path, args: tuple[str, ...], kills: list[str]
) -> None:
    code, out = train(tmp_path / "ref", *args)
    assert code == 0, out
    victim = tmp_path / "victim"
    for kill in kills:
        code, out = train(victim, *args, pause_at=kill)
        assert code == -signal.SIGKILL, out
    code, out = train(victim, *args)
    assert code == 0, out
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 60
    ref = effective_steps(tmp_path / "ref" / "metrics.jsonl")
    got = effective_steps(victim / "metrics.jsonl")
    assert sorted(got) == sorted(ref) == list(range(1, steps + 1))
    assert [(got[s]["loss"], got[s]["lr"], got[s]["update"]) for s in got] == [
        (ref[s]["loss"], ref[s]["lr"], ref[s]["update"]) for s in got
    ]
    resumes = [r for r in read(victim / "metrics.jsonl") if r.get("event") == "resume"]
    assert len(resumes) == len(kills)
    a, b = final_tensors(tmp_path / "ref", steps), final_tensors(victim, steps)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("drop", [None, "sampler"], ids=["passes", "drop-data-position"])
def test_recovery_drill_of_the_example(tmp_path: Path, drop: str | None) -> None:
    # the command: a kill in every commit phase; dropping the data position from the
    # restore (the drill's failure switch) is a difference, exit 23
    import json

    env = {k: v for k, v in os.environ.items() if k not in (KEY_ENV, "RECOVERY_DRILL_DROP")}
    if drop:
        env["RECOVERY_DRILL_DROP"] = drop
    out = tmp_path / "drill"
    cmd = [str(Path(sys.executable).parent / "recovery"), "drill", "--kills", "3", "--seed", "0"]
    cmd += ["--out", str(out), "--", sys.executable, str(SCRIPT), "--run-dir", "{run_dir}"]
    proc = launcher.run(
        [*cmd, "--workers", "1", "--steps", "30"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = json.loads((out / "drill.json").read_text())
    points = [k["point"] for k in report["kills"]]
    assert all(k["reached"] and k["exit"] == -signal.SIGKILL for k in report["kills"])
    assert {p.rsplit("-", 1)[0] for p in points if p.startswith("commit-")} == {
        "commit-write",
        "commit-before-manifest",
        "commit-before-rename",
    }
    if drop is None:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert report["passed"] and report["resumes"]
    else:
        assert proc.returncode == 23, proc.stdout + proc.stderr
        assert any("loss" in d for d in report["differences"]), report
