"""The real console script and ``train.py`` over bad inputs: one line, the README's code,
the input named, no traceback, and nothing left behind."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from recovery.format.layout import SIGNATURE_FILE, step_dir_name
from tests import launcher
from tests.conftest import commit_state, make_signer, tiny_state

ROOT = Path(__file__).resolve().parents[2]
RECOVERY = str(Path(sys.executable).parent / "recovery")


def damaged(tmp: Path) -> dict[str, str]:
    """Placeholders for the table: a committed checkpoint, a damaged one, a file, keys."""
    signer = make_signer(tmp / "keys")
    commit_state(tmp / "run", tiny_state(), 2, signer)
    commit_state(tmp / "run", tiny_state(), 4, signer)
    good, bad = tmp / "run" / step_dir_name(2), tmp / "run" / step_dir_name(4)
    (bad / SIGNATURE_FILE).write_text("[" * 300_000)
    (tmp / "afile").write_text("x")
    return {
        "tmp": str(tmp),
        "good": str(good),
        "bad": str(bad),
        "file": str(tmp / "afile"),
        "keys": str(tmp / "keys"),
    }


CASES = [
    # (argv: "recovery ..." or "train.py ...", exit code, what the one line must name)
    ("train.py checkpoint.evry_steps=5", 12, "did you mean `checkpoint.every_steps`?"),
    ("train.py recipe=nonexist", 12, "recipe=nonexist"),
    ("train.py export.dtype=int8", 12, "export.dtype"),
    ("train.py train.steps=abc", 12, "train.steps"),
    ("train.py signing.key={tmp}/no.key", 20, "no.key"),
    ("recovery drill train.steps=abc", 12, "train.steps"),
    ("recovery drill recipe=nope", 12, "recipe=nope"),
    ("recovery export checkpoint.evry_steps=5", 12, "checkpoint.every_steps"),
    ("recovery verify {tmp}/nowhere", 3, "nowhere"),
    ("recovery verify {bad} --trusted {keys}", 16, "model.sig"),
    ("recovery verify {good}", 17, "step-00000002"),
    ("recovery audit {bad} --trusted {keys}", 16, "model.sig"),
    ("recovery keygen --out {file}", 20, "afile"),
    ("recovery sync {tmp}/nowhere", 3, "nowhere"),
    ("recovery verify {good} --trusted {tmp}/no-such.pub", 12, "no-such.pub"),
    ("recovery drill --kills -1", 12, "--kills"),
]


@pytest.mark.parametrize(("command", "code", "names"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_with_the_readmes_code(tmp_path, command, code, names):
    fill = damaged(tmp_path)
    program, *args = command.format(**fill).split()
    argv = [RECOVERY] if program == "recovery" else [sys.executable, str(ROOT / program)]
    env = {**os.environ, "RECOVERY_SIGNING_KEY": ""}
    env.pop("RECOVERY_SIGNING_KEY")
    run_root = tmp_path / "ckpts"
    extra = [f"checkpoint.root={run_root}", "run.name=r"] if program == "train.py" else []
    done = launcher.run(
        [*argv, *args, *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    err = done.stderr.strip()
    assert done.returncode == code, (done.returncode, err[-2000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-2000:]
    assert names in err, err
    if program == "train.py":  # a run refused at start-up leaves nothing behind
        assert not (run_root / "r").exists(), sorted(run_root.rglob("*"))
