"""Every real resume checks itself (issue 25): own loops with hidden loop state, SIGKILLed.

Each kind of loop state a checkpoint does not see (a batch fetched before the step, an
RNN's hidden state, a test pass through a loader drawing from the global stream after
the epoch's last save, a per-epoch scheduler stepped after it) is left out, and the
resume says ``INEXACT RESUME`` at the first redone step; wired as the README says, the
resume says how many redone steps were bit-identical. Strict mode ends the run with
exit 30; a data position that is not restored is named as a data-order difference.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from recovery import cli
from recovery.cli.commands.listing import resume_checks
from recovery.format.layout import METRICS_FILE, SIGNATURE_FILE, scan, step_dir_name
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.journal import read
from recovery.run.restoring import choose
from recovery.state.registry import DROP_ENV
from recovery.tools.audit import audit
from tests.integration.conftest import run_killed_at

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "hidden_state.py"
PLAIN = ROOT / "examples" / "plain_loop.py"

# kind -> (extra flags, kill point, checkpoint resumed, first redone step, field that differs)
KINDS = {
    "prefetch": ((), "step-8", 5, 6, "loss"),
    "hidden": ((), "step-8", 5, 6, "loss"),
    "eval": (("--every", "8"), "step-11", 8, 9, "loss"),
    "epoch_end": (("--every", "8"), "step-11", 8, 9, "lr"),
}


def run(script: Path, run_dir: Path, *args: str, pause_at: str | None = None,
        env: dict[str, str] | None = None) -> tuple[int, str]:  # fmt: skip
    base = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    cmd = [sys.executable, str(script), "--run-dir", str(run_dir), *args]
    return run_killed_at(cmd, env={**base, **(env or {})}, cwd=run_dir.parent, pause_at=pause_at)


def checks(run_dir: Path) -> list[dict]:
    return [r for r in read(run_dir / METRICS_FILE) if r.get("event") == "resume_check"]


def killed_then_resumed(tmp_path: Path, kind: str, *flags: str) -> tuple[int, str, Path]:
    extra, kill, _, _, _ = KINDS[kind]
    run_dir = tmp_path / "run"
    code, out = run(FIXTURE, run_dir, "--kind", kind, *extra, *flags, pause_at=kill)
    assert code == -signal.SIGKILL, out
    code, out = run(FIXTURE, run_dir, "--kind", kind, *extra, *flags)
    return code, out, run_dir


@pytest.mark.parametrize("kind", list(KINDS))
def test_hidden_loop_state_left_out_is_an_inexact_resume_naming_the_first_step(tmp_path, kind):
    _, kill, resumed, first, field = KINDS[kind]
    code, out, run_dir = killed_then_resumed(tmp_path, kind, "--forget")
    assert code == 0, out  # not strict: the run goes on, loudly
    assert (
        f"WARNING INEXACT RESUME at step {first} (resumed from step {resumed}): {field} was" in out
    )
    assert "Likely:" in out
    inexact, summary = checks(run_dir)
    assert inexact["status"] == "inexact" and inexact["first"]["step"] == first
    assert inexact["first"]["field"] == field
    assert inexact["first"]["expected"] != inexact["first"]["found"]
    redone = int(kill.split("-")[1]) - resumed
    assert summary["summary"] and summary["status"] == "inexact"
    assert (summary["compared"], summary["redone"]) == (redone, [resumed + 1, resumed + redone])
    # the run's later checkpoints sign it into their lineage: `recovery audit` shows it
    final = audit(run_dir / step_dir_name(16), TrustStore([]), allow_untrusted=True)
    (link,) = [lk for lk in final.links if lk.relation == "resume"]
    assert link.check is not None and link.check["status"] == "inexact"
    assert link.check["first"]["step"] == first
    # `recovery ls` shows it for that resume
    assert resume_checks(run_dir) == [
        {"step": resumed, "from": f"step-{resumed:08d}", "status": "inexact",
         "check": f"INEXACT at step {first} ({field}); 0 of {redone} identical"}
    ]  # fmt: skip


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_same_loop_wired_right_says_its_redone_steps_were_bit_identical(tmp_path, kind):
    _, kill, resumed, _, _ = KINDS[kind]
    code, out, run_dir = killed_then_resumed(tmp_path, kind)
    assert code == 0, out
    redone = int(kill.split("-")[1]) - resumed
    assert f"resume check: {redone} redone steps bit-identical with the run that died" in out
    assert "INEXACT" not in out
    assert [(c["status"], c["identical"]) for c in checks(run_dir)] == [("exact", redone)]


def test_strict_mode_stops_an_inexact_resume_with_exit_30_and_one_line(tmp_path):
    code, out, run_dir = killed_then_resumed(tmp_path, "hidden", "--forget", "--strict")
    assert code == 30, out
    assert "Traceback" not in out
    assert "ERROR error: INEXACT RESUME at step 6" in out and "(exit 30)" in out
    # stopped at the first differing step: nothing after the checkpoint it resumed was saved
    assert [s for s, _ in scan(run_dir).committed] == [5]
    assert checks(run_dir)[0]["strict"] is True


def test_a_data_position_not_restored_is_named_as_a_data_order_difference(tmp_path):
    run_dir = tmp_path / "run"
    args = ("--steps", "16", "--every", "5", "--workers", "0")
    code, out = run(PLAIN, run_dir, *args, pause_at="step-8")
    assert code == -signal.SIGKILL, out
    code, out = run(PLAIN, run_dir, *args, env={DROP_ENV: "sampler"})
    assert code == 0, out
    first = checks(run_dir)[0]["first"]
    assert (first["step"], first["field"]) == (6, "batch")
    assert "Likely: the data order differs" in out


@pytest.mark.parametrize("forget", [False, True], ids=["before-the-save", "after-the-save"])
def test_epoch_end_work_killed_at_the_epoch_boundary(tmp_path, forget):
    """Saved every step, killed right after the epoch's last save: the documented pattern
    (the per-epoch scheduler stepped before that save) ends bit-identical to an
    uninterrupted run; the natural shape (stepped after it) does not."""
    flags = ("--kind", "epoch_end", "--every", "1", *(("--forget",) if forget else ()))
    code, out = run(FIXTURE, tmp_path / "ref", *flags)
    assert code == 0, out
    victim = tmp_path / "victim"
    code, out = run(FIXTURE, victim, *flags, pause_at="step-8")  # the epoch's last step
    assert code == -signal.SIGKILL, out
    code, out = run(FIXTURE, victim, *flags)
    assert code == 0, out
    trust = TrustStore([])
    final = [
        choose.load(d / step_dir_name(16), trust, allow_untrusted=True).decoded.tree["model"]
        for d in (tmp_path / "ref", victim)
    ]
    same = all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    assert same is not forget


def _edit_statement(final: Path, edit) -> None:
    """Edit the signed statement in ``final``'s model.sig, keeping the old signature."""
    bundle = json.loads((final / SIGNATURE_FILE).read_bytes())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    edit(statement["predicate"]["recovery"]["lineage"])
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    (final / SIGNATURE_FILE).write_text(json.dumps(bundle))


def test_each_resumes_verdict_is_signed_shown_by_verify_and_audit_and_cannot_be_forged(
    tmp_path, capsys
):
    code, out, run_dir = killed_then_resumed(tmp_path, "hidden", "--forget")
    assert code == 0, out
    final = run_dir / step_dir_name(16)
    # the certificate is in the checkpoint's signed lineage: verify shows it, no journal read
    (run_dir / METRICS_FILE).unlink()
    assert cli.main(["verify", str(final), "--allow-untrusted"]) == 0
    text = capsys.readouterr().out
    assert "certificate: 1 resume, INEXACT" in text
    assert "resume at step 5: INEXACT at step 6 (loss); 0 of 3 identical" in text
    assert cli.main(["audit", str(final), "--allow-untrusted", "--json"]) == 0
    (resume,) = json.loads(capsys.readouterr().out)["certificate"]
    assert resume["at_step"] == 5 and resume["check"]["status"] == "inexact"
    # an inexact resume made to look exact, or its verdict stripped: the signature fails
    saved = (final / SIGNATURE_FILE).read_bytes()
    forgeries = {
        "made exact": lambda segs: segs[-1]["check"].update(status="exact", identical=3),
        "stripped": lambda segs: segs[-1].pop("check"),
    }
    for name, edit in forgeries.items():
        _edit_statement(final, edit)
        assert cli.main(["verify", str(final), "--allow-untrusted"]) == 16, name
        assert "signature" in capsys.readouterr().err, name
        (final / SIGNATURE_FILE).write_bytes(saved)
    assert cli.main(["verify", str(final), "--allow-untrusted"]) == 0


BN_LOOP = ROOT / "tests" / "fixtures" / "bn_loop.py"


@pytest.mark.parametrize("gate", ["enumerate", "step"])
def test_module_state_that_moved_at_other_steps_is_caught_by_the_fingerprint(tmp_path, gate):
    """dcgan's shape: a periodic train-mode forward pass gated on enumerate()'s i, which
    restarts at 0 after a mid-epoch resume, moves BatchNorm's running statistics at other
    steps; every loss still matches, the fingerprint's ``buffers`` do not (default
    ``fingerprint=auto``). Gated on the step, the same loop resumes exactly."""
    run_dir = tmp_path / "run"
    code, out = run(BN_LOOP, run_dir, "--gate", gate, pause_at="step-16")
    assert code == -signal.SIGKILL, out
    code, out = run(BN_LOOP, run_dir, "--gate", gate)
    assert code == 0, out
    if gate == "step":
        assert "resume check: 1 redone steps bit-identical" in out, out
        return
    assert "WARNING INEXACT RESUME at step 16 (resumed from step 15): buffers was" in out, out
    assert "BatchNorm's running statistics" in out  # the likely cause, named
    (first,) = [c["first"] for c in checks(run_dir) if c.get("first") and not c.get("summary")]
    assert first["field"] == "buffers" and first["step"] == 16
    records = [r for r in read(run_dir / METRICS_FILE) if r.get("step") == 16 and "event" not in r]
    died, redone = records  # step 16 as the dead run and the resumed one journaled it
    assert died["loss"] == redone["loss"] and died["parameters"] == redone["parameters"]
    assert died["buffers"] != redone["buffers"]
