"""``recovery audit``: its lineage index stays inside the target's checkpoint root, is
bounded, never follows a link out, and skips what it cannot read with a one-line warning,
while the target is still verified and reported."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from recovery import cli
from recovery.config import CheckpointConfig
from recovery.format.layout import ABANDONED_DIR, SIGNATURE_FILE, step_dir_name
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal
from recovery.tools import audit, audit_index
from tests import launcher
from tests.conftest import tiny_state, train_steps

REPO = Path(__file__).resolve().parents[2]
CHAIN = [
    ("self", "step-00000003", "ok"),
    ("previous", "step-00000002", "ok"),
    ("warm_start", "step-00000004", "ok"),
    ("previous", "step-00000002", "ok"),
]
"""``new``'s last checkpoint back to the start of ``src``, the run it was warm-started from."""
LOGGER = "recovery.tools.audit_index"


def _run(
    root: Path,
    name: str,
    steps: int,
    keys: dict,
    init_from: Path | None = None,
    *,
    resume: int | None = None,
    keep_last: int = 2,
) -> Path:
    """Train run ``root/name`` to ``steps`` (saving every 2; resumed from step ``resume``,
    which branches it when it had gone further); its last checkpoint."""
    state = tiny_state()
    journal = Journal(root / name / "metrics.jsonl")
    ck = Checkpointer(
        CheckpointConfig(root=str(root), every_steps=2, keep_last=keep_last),
        root / name,
        final_step=steps,
        journal=journal,
        signer=keys["signer"],
        trust=keys["trust"],
        provenance=keys["prov"],
        config={"seed": 0},
        model_config={"width": 4},
    )
    step = ck.restore(state, resume, init_from=str(init_from) if init_from else None)
    while step < steps:
        train_steps(state, 1)
        step += 1
        ck.maybe_save(state, step)
    ck.close()
    journal.close()
    return root / name / step_dir_name(steps)


@pytest.fixture
def lineage(tmp_path, signer, trust, prov):
    """A checkpoint root: run ``src`` (steps 2, 4) and ``new`` warm-started from src's step 4
    (steps 2, 3). Returns (root, head = new's step 3)."""
    keys = {"signer": signer, "trust": trust, "prov": prov}
    root = tmp_path / "ck"
    source = _run(root, "src", 4, keys)
    return root, _run(root, "new", 3, keys, init_from=source)


def _audit(head: Path, signer, *extra: str, capsys) -> tuple[int, list[tuple], str]:
    code = cli.main(["audit", str(head), "--json", "--trusted", str(signer.path.parent), *extra])
    out, err = capsys.readouterr()
    links = json.loads(out)["links"] if out else []
    return code, [(ln["relation"], ln["name"], ln["status"]) for ln in links], err


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name in (audit.__name__, LOGGER)]


def test_a_normal_audit_walks_the_lineage_across_runs(lineage, signer, capsys, caplog):
    _, head = lineage
    code, chain, _ = _audit(head, signer, capsys=capsys)
    assert (code, chain) == (0, CHAIN)
    assert _warnings(caplog) == []


def test_a_relative_target_still_finds_the_runs_beside_its_own(
    lineage, signer, capsys, monkeypatch
):
    _, head = lineage
    monkeypatch.chdir(head.parent)  # `recovery audit step-00000003` from inside the run dir
    code, chain, _ = _audit(Path(head.name), signer, capsys=capsys)
    assert (code, chain) == (0, CHAIN)


def test_junk_elsewhere_in_the_root_is_skipped_with_one_line_each(lineage, signer, capsys, caplog):
    root, head = lineage
    junk = root / "junk"
    (junk / step_dir_name(7)).mkdir(parents=True)
    (junk / step_dir_name(7) / SIGNATURE_FILE).write_bytes(b"{not a bundle")  # malformed
    os.mkfifo(junk / step_dir_name(8))  # a checkpoint directory replaced by a FIFO
    (junk / step_dir_name(9)).mkdir()
    os.mkfifo(junk / step_dir_name(9) / SIGNATURE_FILE)  # would block a plain open()
    (junk / step_dir_name(10)).mkdir()  # a step-named directory with no manifest at all
    (junk / "loop").symlink_to("loop")  # a symlink loop
    outside = root.parent / "outside"
    shutil.copytree(root / "src", outside)
    (root / "src-link").symlink_to(outside)  # a link out of the root: never followed
    code, chain, _ = _audit(head, signer, capsys=capsys)
    assert (code, chain) == (0, CHAIN)
    lines = _warnings(caplog)
    assert all("\n" not in line for line in lines)
    for name, why in [
        (f"junk/{step_dir_name(7)}", "malformed"),
        (f"junk/{step_dir_name(8)}", "not a directory"),
        (f"junk/{step_dir_name(9)}", "not a regular file"),
        (f"junk/{step_dir_name(10)}", f"no {SIGNATURE_FILE}"),
        ("junk/loop", "symlink"),
        ("src-link", "symlink"),
    ]:
        assert any(f"{root / name}:" in line and why in line for line in lines), (name, lines)
    assert not any(str(outside) in line for line in lines)  # nothing beyond the link was read


def test_the_walk_stops_at_the_cap_and_says_so(lineage, signer, capsys, caplog, monkeypatch):
    root, head = lineage
    for i in range(50):
        (root / "aaa-clutter" / f"d{i:02d}").mkdir(parents=True)  # listed before src and new
    monkeypatch.setattr(audit_index, "MAX_DIRS", 20)
    code, chain, _ = _audit(head, signer, capsys=capsys)
    # the target and its own run are still verified; what the cap kept it from is said loudly
    assert code == 0 and chain[:2] == CHAIN[:2]
    assert chain[2] == ("warm_start", "step-00000004", "pruned")
    lines = _warnings(caplog)
    assert any("20 directories" in line and str(root) in line for line in lines), lines
    assert any("step-00000004" in line and "may still be on disk" in line for line in lines)


@pytest.mark.skipif(
    os.geteuid() == 0 and shutil.which("setpriv") is None,
    reason="as root, a directory is unreadable only without CAP_DAC_OVERRIDE (setpriv)",
)
def test_an_unreadable_directory_elsewhere_is_skipped_not_a_crash(lineage, signer):
    root, head = lineage
    private = root / "private" / "r"
    (private / step_dir_name(5)).mkdir(parents=True)
    os.chmod(root / "private", 0)
    # root reads through mode 0; drop the capabilities that let it, so the denial is real
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    argv = ["audit", str(head), "--json", "--trusted", str(signer.path.parent)]
    try:
        done = launcher.run(
            [
                *drop,
                sys.executable,
                "-c",
                f"import sys; from recovery import cli; sys.exit(cli.main({argv!r}))",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    finally:
        os.chmod(root / "private", 0o755)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    chain = [(ln["relation"], ln["name"], ln["status"]) for ln in json.loads(done.stdout)["links"]]
    assert chain == CHAIN
    assert f"{root / 'private'}: cannot list it (Permission denied)" in done.stderr


@pytest.mark.parametrize(
    ("make", "code", "says"),
    [
        (lambda d: d, 4, "not a committed checkpoint"),  # an unrelated directory ($HOME-like)
        (lambda d: Path("/"), 4, "not a committed checkpoint"),
        (lambda d: d / "notes.txt", 3, "is a file"),
        (lambda d: d / "nope", 3, "no such checkpoint directory"),
    ],
)
def test_a_path_that_is_no_checkpoint_is_one_line_and_no_walk(
    tmp_path, capsys, monkeypatch, make, code, says
):
    home = tmp_path / "home" / "user"
    for sub in ("projects/a", "projects/b", ".cache/x"):
        (home / sub).mkdir(parents=True)
    (home / "notes.txt").write_text("hello")

    def walked(root):
        raise AssertionError(f"audit indexed {root} for a target that is not a checkpoint")

    monkeypatch.setattr(audit, "index", walked)
    target = make(home)
    assert cli.main(["audit", str(target)]) == code
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.count("\n") == 1 and err.startswith(f"error: {target}") and says in err, err


@pytest.fixture
def branched(tmp_path, signer, trust, prov):
    """Run ``team/r`` (a run name with a slash) to step 6, run ``w`` warm-started from its
    step 6, then ``team/r`` resumed from step 2, which moves its old steps 4 and 6 to
    ``abandoned/<branch>/`` and writes a new step 4 (same name, other digest) in their place.
    Returns (root, run directory, the branch directory)."""
    keys = {"signer": signer, "trust": trust, "prov": prov}
    root = tmp_path / "ck"
    six = _run(root, "team/r", 6, keys, keep_last=10)
    _run(root, "w", 2, keys, init_from=six)
    _run(root, "team/r", 4, keys, resume=2, keep_last=10)
    run_dir = root / "team" / "r"
    (branch,) = (run_dir / ABANDONED_DIR).iterdir()
    assert not six.exists() and (branch / six.name).is_dir()
    return root, run_dir, branch


def _links(data: dict) -> list[tuple]:
    return [(ln["relation"], ln["name"], ln["status"], ln["path"]) for ln in data["links"]]


def test_an_abandoned_checkpoint_is_audited_from_the_root_above_its_run(
    branched, signer, trust, capsys
):
    _, run_dir, branch = branched
    target = branch / step_dir_name(6)
    said = {"branch": branch.name, "run_dir": str(run_dir)}
    argv = ["audit", str(target), "--trusted", str(signer.path.parent)]
    assert cli.main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    # the old step 4 is found where it was moved to (by digest), not the new step 4 at its
    # recorded place, and step 2 in the run directory above abandoned/<branch>/
    assert _links(data) == [
        ("self", "step-00000006", "ok", str(target)),
        ("previous", "step-00000004", "ok", str(branch / step_dir_name(4))),
        ("previous", "step-00000002", "ok", str(run_dir / step_dir_name(2))),
    ]
    assert data["ok"] and data["abandoned"] == said
    assert [ln["abandoned"] for ln in data["links"]] == [said, said, None]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert f"abandoned branch {branch.name}, moved out of {run_dir}" in text.splitlines()[1]
    assert text.count(f"abandoned branch {branch.name}") == 3  # the target's line and link 4
    assert text.rstrip().endswith("result: OK")
    # the library: the same root by default, the same report
    assert audit.default_root(target) == run_dir.parent
    report = audit.audit(target, trust)
    assert report.ok and report.abandoned == said and len(report.links) == 3


def test_a_lineage_through_an_abandoned_step_still_verifies(branched, signer, trust, capsys):
    root, run_dir, branch = branched
    head = root / "w" / step_dir_name(2)
    assert cli.main(["audit", str(head), "--json", "--trusted", str(signer.path.parent)]) == 0
    data = json.loads(capsys.readouterr().out)
    # run team/r's abandoned/<branch>/ lies one level past MAX_DEPTH below the root: the
    # index still lists it (abandoned/<branch>/ costs no depth)
    assert data["abandoned"] is None
    assert _links(data) == [
        ("self", "step-00000002", "ok", str(head)),
        ("warm_start", "step-00000006", "ok", str(branch / step_dir_name(6))),
        ("previous", "step-00000004", "ok", str(branch / step_dir_name(4))),
        ("previous", "step-00000002", "ok", str(run_dir / step_dir_name(2))),
    ]
    report = audit.audit(head, trust)
    assert [link.status for link in report.links] == ["ok"] * 4
    assert report.abandoned is None and report.links[0].abandoned is None
    assert report.links[1].abandoned == {"branch": branch.name, "run_dir": str(run_dir)}


def test_a_directory_named_abandoned_is_no_branch_unless_its_layout_says_so(tmp_path):
    run_dir = tmp_path / "ck" / "r"
    assert audit_index.abandoned_of(run_dir / ABANDONED_DIR / "notes" / step_dir_name(6)) is None
    assert audit_index.abandoned_of(run_dir / step_dir_name(6)) is None
    branch = "from-00000002-20261201T120000"
    where = audit_index.abandoned_of(run_dir / ABANDONED_DIR / branch / step_dir_name(6))
    assert where == {"branch": branch, "run_dir": str(run_dir)}


def test_the_index_never_enters_virtualenvs_git_or_hidden_directories(
    lineage, signer, capsys, caplog, monkeypatch
):
    root, head = lineage
    for junk in (".venv", "venv", ".git", "node_modules", "lib/python3/site-packages"):
        (root / junk / step_dir_name(7)).mkdir(parents=True)  # would each warn if listed
        (root / junk / step_dir_name(7) / SIGNATURE_FILE).write_bytes(b"{not a bundle")
    (root / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (root / ".venv" / "lib64").symlink_to(root / "lineage-outside")
    listed = []
    real_scandir = os.scandir
    monkeypatch.setattr(
        audit_index.os, "scandir", lambda p: listed.append(Path(p)) or real_scandir(p)
    )
    code, chain, _ = _audit(head, signer, capsys=capsys)
    assert (code, chain) == (0, CHAIN)
    assert _warnings(caplog) == []
    assert not {".venv", "venv", ".git", "node_modules", "site-packages"} & {
        part for path in listed for part in path.parts
    }


def test_a_checkpoint_retention_deleted_is_reported_so_not_as_a_warning(
    tmp_path, signer, trust, prov, capsys, caplog, monkeypatch
):
    keys = {"signer": signer, "trust": trust, "prov": prov}
    root = tmp_path / "ck"
    head = _run(root, "r", 8, keys, keep_last=2)  # kept: 6 and 8; 2 and 4 retired
    assert sorted(p.name for p in (root / "r").glob("step-*")) == ["step-00000006", head.name]
    monkeypatch.setattr(audit_index, "MAX_DIRS", 1)  # an incomplete index must not matter
    code = cli.main(["audit", str(head), "--json", "--trusted", str(signer.path.parent)])
    links = json.loads(capsys.readouterr().out)["links"]
    assert code == 0
    assert [(ln["name"], ln["status"], ln["retired_at"]) for ln in links] == [
        (head.name, "ok", None),
        ("step-00000006", "ok", None),
        ("step-00000004", "pruned", 8),  # removed by retention when step 8 was committed
    ]
    assert not any("not in the index" in line for line in _warnings(caplog))
    shutil.rmtree(root / "r" / "step-00000006")  # deleted by hand: no retention recorded it
    assert cli.main(["audit", str(head), "--json", "--trusted", str(signer.path.parent)]) == 0
    links = json.loads(capsys.readouterr().out)["links"]
    assert [(ln["name"], ln["status"], ln["retired_at"]) for ln in links[1:]] == [
        ("step-00000006", "pruned", None)
    ]
