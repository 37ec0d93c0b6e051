"""``recovery report`` and the drill's page: the journal read as a story (table tests), the
cost arithmetic, and reports of real in-process runs with a branch, a warm start and (in a
2-rank run's journal and statement shape) two ranks, each with its specifics visible;
``recovery audit --format dot``; hostile names escaped; the refusals in one line."""

from __future__ import annotations

import json
import math
import re
from html import unescape
from pathlib import Path

import matplotlib  # noqa: F401  (make test installs the plot extra: a missing one fails)
import pytest

from recovery import cli
from recovery.config import CheckpointConfig
from recovery.format.layout import ABANDONED_DIR, METRICS_FILE, step_dir_name
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import read
from recovery.tools import report
from recovery.tools.drill import verdict as drill_verdict
from recovery.tools.report import drill as report_drill
from recovery.tools.report import lineage as report_lineage
from recovery.tools.report.cost import cost
from recovery.tools.report.run import COMPLETED, ENDED, PREEMPTED, story
from tests.conftest import resign, tiny_state, train_steps
from tests.unit.test_layers import BLOCK, python


def _run(root: Path, name: str, steps: int, keys: dict, *, resume=None, init_from=None,
         stop_at: int | None = None, every: int = 4, keep_last: int = 2) -> Path:  # fmt: skip
    """Train ``root/name`` in this process up to ``stop_at`` (default ``steps``), saving every
    ``every``; resumed from ``resume`` (a branch when the run had gone further) or
    warm-started from ``init_from``. Returns the run directory."""
    state = tiny_state()
    ck = Checkpointer(
        CheckpointConfig(root=str(root), every_steps=every, keep_last=keep_last),
        root / name,
        final_step=steps,
        signer=keys["signer"],
        trust=keys["trust"],
        provenance=keys["prov"],
        config={"seed": 0},
        model_config={"width": 4},
        preemption=False,
    )
    step = ck.restore(state, resume, init_from=str(init_from) if init_from else None)
    while step < (stop_at or steps):
        (loss,) = train_steps(state, 1)
        step += 1
        ck.record(step, loss=loss)
        ck.maybe_save(state, step)
    ck.close()
    return root / name


@pytest.fixture
def keys(signer, trust, prov):
    return {"signer": signer, "trust": trust, "prov": prov}


def _report(run_dir: Path, signer, tmp_path, *extra: str) -> tuple[int, str, str]:
    out = tmp_path / "out.html"
    argv = ["report", str(run_dir), "--out", str(out), "--trusted", str(signer.path.parent)]
    code = cli.main([*argv, *extra])
    return code, out.read_text() if out.exists() else "", str(out)


def _text(html: str) -> str:
    """The page's visible text, tags dropped (what a reader sees, roughly)."""
    return re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))


# -- the journal as a story ---------------------------------------------------------------


def test_the_journal_reads_as_processes_resumes_and_saves():
    records = [
        {"event": "start", "run_id": "abc"},
        *({"step": s, "loss": 1.0 / s, "lr": 0.1} for s in range(1, 11)),
        {"event": "checkpoint", "step": 4, "mode": "sync", "pause_s": 0.2, "write_s": 0.2,
         "bytes": 10},
        {"event": "checkpoint", "step": 8, "mode": "sync", "pause_s": 0.4, "write_s": 0.4},
        {"event": "resume", "run_id": "abc", "from": "/r/step-00000008", "step": 8,
         "skipped": ["/r/step-00000012"], "drift": ["config"], "world_size": 1,
         "restored": ["model", "optimizer"], "absent": {"scheduler": "constant lr"}},
        *({"step": s, "loss": 2.0 / s, "lr": 0.1} for s in range(9, 13)),
        {"event": "retired", "steps": [4]},
        {"event": "resume_health", "status": "warn", "resumed_at": 8, "departed": ["update"],
         "signals": {"update": {"z": 25.2}}},
        {"event": "warning", "kind": "stepped_after_save", "component": "model",
         "message": "moved <after> save"},
        {"event": "preempted", "signal": "SIGTERM", "step": 12},
        {"event": "resume", "from": "/r/step-00000012", "step": 12, "world_size": 1},
        {"step": 13, "loss": 0.5},
        {"event": "run_summary", "run_s": 2.0, "checkpoint_pause_s": 0.5},
    ]  # fmt: skip
    st = story(records)
    assert [(p.kind, p.first_step, p.last_step, p.ended) for p in st.processes] == [
        ("start", 1, 10, ENDED),
        ("resume", 9, 12, PREEMPTED),
        ("resume", 13, 13, COMPLETED),
    ]
    first, second = st.resumes
    assert (first.name, first.redone, first.previous_end, first.verdict) == (
        "step-00000008", (9, 10), ENDED, "warn"
    )  # fmt: skip
    assert first.absent == {"scheduler": "constant lr"} and first.drift == ["config"]
    assert (second.redone, second.previous_end, second.verdict) == (None, PREEMPTED, "not judged")
    assert st.retired == {4} and sorted(st.saves) == [4, 8]
    assert [r["step"] for r in st.superseded[0]] == [9, 10]  # the curve before the resume
    assert st.steps[9]["loss"] == 2.0 / 9  # the surviving record
    assert any("moved <after> save" in w for w in st.warnings)
    assert any("passed over /r/step-00000012" in w for w in st.warnings)


def test_the_cost_is_the_measured_pause_against_the_young_daly_optimum():
    records = [
        {"event": "start", "run_id": "a"},
        *({"step": s} for s in range(1, 101)),
        *({"event": "checkpoint", "step": s, "mode": "sync", "pause_s": 2.0, "write_s": 2.0}
          for s in (50, 100)),
        {"event": "run_summary", "run_s": 100.0, "checkpoint_pause_s": 4.0,
         "interval": {"mode": "fixed", "every_steps": 50, "every_seconds": 0.0}},
    ]  # fmt: skip
    c = cost(story(records), mtbf_s=3600.0)
    assert (c.cost_s, c.fraction, c.step_s, c.interval_s) == (2.0, 0.04, 1.0, 50.0)
    assert c.optimum_s == pytest.approx(math.sqrt(2 * 2.0 * 3600.0))  # 120 s
    assert c.break_even_mtbf_s == pytest.approx(50.0**2 / 4.0)
    assert [r["this_run"] for r in c.rows] == [True, False] and c.rows[1]["optimum"]
    assert cost(story(records)).mtbf_source == "assumed"
    auto = {"mode": "auto", "seconds": 30.0, "mtbf_s": 7200.0}
    records[-1] = {**records[-1], "interval": auto}
    assert (cost(story(records)).interval_s, cost(story(records)).mtbf_source) == (30.0, "recorded")


# -- reports of real runs -------------------------------------------------------------------


def test_a_resumed_run_reports_the_resume_checkpoints_lineage_and_cost(tmp_path, keys, signer):
    run_dir = _run(tmp_path / "ck", "r", 16, keys, stop_at=10)  # stops after step 10
    _run(tmp_path / "ck", "r", 16, keys, resume="latest")  # resumes at 8, redoes 9-10
    code, html, _ = _report(run_dir, signer, tmp_path, "--mtbf", "1h")
    assert code == 0
    text = _text(html)
    assert "resumed from step-00000008" in text  # in the chart and the resumes table
    assert "steps redone" in text and " 9-10 " in text
    assert "every checkpoint on disk verified (2)" in text
    assert "retired" in text and "Young/Daly optimum" in text and "given" in text
    assert not re.search(r"https?:", re.sub(r'xmlns(:\w+)?="[^"]*"', "", html))  # no fetch
    assert "<script" not in html


def test_a_branched_run_shows_its_abandoned_branch_in_the_graph_and_the_timeline(
    tmp_path, keys, signer
):
    run_dir = _run(tmp_path / "ck", "r", 12, keys, keep_last=4)  # 4, 8, 12
    _run(tmp_path / "ck", "r", 16, keys, resume=4, keep_last=4)  # a branch at 4: 8, 12 moved
    (branch,) = (run_dir / ABANDONED_DIR).iterdir()
    built = report.build(run_dir, keys["trust"])
    assert built.failures == []
    lanes = {n.lane for n in built.graph.nodes.values()}
    assert any(f"abandoned branch {branch.name}" in lane for lane in lanes)
    moved = [r for r in built.checkpoints if r.where == "abandoned"]
    assert sorted(r.step for r in moved) == [8, 12] and all(r.verdict == "ok" for r in moved)
    # step 4 is the fork: one edge to the branch's own step 8, one to the abandoned one
    four = next(k for k, n in built.graph.nodes.items() if n.link and n.link.step == 4)
    assert len([e for e in built.graph.edges if e.older == four]) == 2
    assert f"abandoned ({branch.name})" in _text(built.html)
    dot = report_lineage.dot(built.graph, "x")
    assert dot.count("subgraph cluster_") == 2 and branch.name in dot


def test_a_warm_started_run_walks_back_into_the_run_it_came_from(tmp_path, keys, signer):
    source = _run(tmp_path / "ck", "src", 8, keys)
    new = _run(tmp_path / "ck", "ws", 4, keys, init_from=source / step_dir_name(8))
    assert read(new / METRICS_FILE)[0]["event"] == "warm_start"
    built = report.build(new, keys["trust"])
    relations = {e.relation for e in built.graph.edges}
    assert {"warm_start", "previous", "start"} <= relations
    src_id = read(source / METRICS_FILE)[0]["run_id"]
    assert f"start of run {src_id[:8]}" in _text(built.html)
    assert len({n.lane for n in built.graph.nodes.values()}) == 2  # the two runs' lanes
    assert built.story.processes[0].kind == "warm_start"
    # from the source's side: what was made from it is named with --export
    code, html, _ = _report(source, signer, tmp_path, "--export", str(new / step_dir_name(4)))
    assert code == 0 and f"run {read(new / METRICS_FILE)[0]['run_id'][:8]}" in _text(html)
    assert "warm_start" in _text(html)


def test_a_two_rank_run_shows_its_world_sizes_and_the_resharded_resume(tmp_path, keys, signer):
    """A 2-rank job resumed on one process, in the journal and statement shape a real
    torchrun job writes (``world_size`` in each statement and resume record, ``resharded``
    on the resume and its lineage segment; see tests/integration/test_distributed.py),
    made from a real run re-signed: the report reads these fields, not the shards."""
    run_dir = _run(tmp_path / "ck", "r", 16, keys, stop_at=10)
    _run(tmp_path / "ck", "r", 16, keys, resume="latest")

    def two_then_one(statement: dict) -> None:
        rec = statement["predicate"]["recovery"]
        rec["world_size"] = 2 if rec["step"] <= 8 else 1
        for seg in rec.get("lineage", []):
            seg["world_size"] = 2 if seg["kind"] == "start" else 1
            if seg["kind"] == "resume":
                seg["resharded"] = {"from": 2, "to": 1}

    for step in (12, 16):
        resign(run_dir / step_dir_name(step), signer, two_then_one)
    lines = (run_dir / METRICS_FILE).read_text().splitlines()
    edited = []
    for line in lines:
        rec = json.loads(line)
        if rec.get("event") == "resume":
            rec |= {"world_size": 1, "resharded": {"from": 2, "to": 1}}
        edited.append(json.dumps(rec))
    (run_dir / METRICS_FILE).write_text("\n".join(edited) + "\n")
    code, html, _ = _report(run_dir, signer, tmp_path)
    assert code == 0
    text = _text(html)
    assert "1 (resharded 2->1)" in text  # the resumes table
    assert "resume (2->1 ranks)" in text  # the lineage edge
    built = report.build(run_dir, keys["trust"])
    assert {r.world_size for r in built.checkpoints if r.verdict == "ok"} == {1}
    assert "world size 1" in text


def test_a_damaged_checkpoint_is_red_and_fails_the_command_after_writing(
    tmp_path, keys, signer, capsys
):
    run_dir = _run(tmp_path / "ck", "r", 8, keys)
    (run_dir / step_dir_name(4) / "model.safetensors").write_bytes(b"damaged")
    code, html, out = _report(run_dir, signer, tmp_path)
    assert code == 8  # a file of the wrong size, as `recovery ls` and `audit` exit
    assert "FAILED" in _text(html) and Path(out).exists()
    assert "failed verification" in capsys.readouterr().err


def test_hostile_names_are_escaped_everywhere(tmp_path, keys, signer):
    run_dir = _run(tmp_path / "ck", "r", 8, keys)
    evil = '<img src=x onerror=alert(1)> "$x^$" </svg><script>alert(2)</script>'
    with open(run_dir / METRICS_FILE, "a") as fh:
        fh.write(json.dumps({"event": "resume", "from": f"/x/{evil}", "step": 8}) + "\n")
        fh.write(json.dumps({"event": "warning", "kind": evil, "message": evil}) + "\n")
    code, html, _ = _report(run_dir, signer, tmp_path)
    assert code == 0
    assert "<script" not in html and "<img" not in html and "onerror=alert(1)>" not in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html


def test_a_journal_with_fields_of_the_wrong_type_still_renders(tmp_path, keys, signer):
    run_dir = _run(tmp_path / "ck", "r", 8, keys)
    odd = [
        {"event": "resume", "from": 3, "step": "8", "restored": "model", "absent": ["x"],
         "drift": 7, "skipped": None, "world_size": "two", "resharded": [2, 1]},
        {"event": "resume_health", "resumed_at": 0, "status": 5, "signals": ["z"],
         "departed": "loss"},
        {"event": "resume_health", "resumed_at": 0, "signals": {"loss": {"z": "high"}}},
        {"event": "retired", "steps": 4}, {"event": "abandoned", "steps": "8", "to": 1},
        {"event": "checkpoint", "step": 8, "pause_s": "slow", "bytes": 1.5},
        {"step": 9, "loss": "nan?", "lr": None}, {"step": True, "loss": 1.0},
        {"event": "run_summary", "run_s": "long", "interval": {"every_steps": "4"}},
    ]  # fmt: skip
    with open(run_dir / METRICS_FILE, "a") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in odd)
    code, html, _ = _report(run_dir, signer, tmp_path)
    assert code == 0 and "Cost of checkpointing" in html


def test_a_reference_run_is_overlaid_and_compared(tmp_path, keys, signer):
    ref = _run(tmp_path / "ck", "ref", 8, keys)
    same = _run(tmp_path / "ck", "same", 8, keys)
    code, html, _ = _report(same, signer, tmp_path, "--reference", str(ref))
    assert code == 0 and "bitwise identical at all 8 common steps" in _text(html)
    assert "loss - reference" in html


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: None, "no such run directory"),
        (lambda p: p.mkdir(), "holds no journal"),
    ],
)
def test_no_run_there_is_one_line_and_exit_3(tmp_path, capsys, make, message, signer):
    make(tmp_path / "nothing")
    code, _, _ = _report(tmp_path / "nothing", signer, tmp_path)
    err = capsys.readouterr().err
    assert code == 3 and message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_without_matplotlib_the_report_exits_12_naming_the_extra(tmp_path):
    (tmp_path / "run").mkdir()  # a core-only install: matplotlib (the plot extra) absent
    out = python(BLOCK + "from recovery import cli\nsys.exit(cli.main(['report', 'run']))",
                 cwd=tmp_path)  # fmt: skip
    assert out.returncode == 12, out.stderr
    assert "pip install -e '.[plot]'" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


# -- audit --format dot ---------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pyparsing's, inside pydot
def test_audit_format_dot_is_the_same_graph_for_graphviz(tmp_path, keys, signer, capsys):
    run_dir = _run(tmp_path / "ck", "r", 16, keys, stop_at=10)
    _run(tmp_path / "ck", "r", 16, keys, resume="latest")
    head = run_dir / step_dir_name(16)
    code = cli.main(["audit", str(head), "--format", "dot", "--trusted", str(signer.path.parent)])
    dot = capsys.readouterr().out
    assert code == 0 and dot.startswith("digraph lineage {") and dot.rstrip().endswith("}")
    assert '[label="resume"]' in dot and '[label="start"]' in dot
    import pydot  # a real DOT parser (installed with dvc, part of make test's extras)

    (parsed,) = pydot.graph_from_dot_data(dot)
    assert len(parsed.get_edges()) == 3  # start -> 8 (pruned) -resume-> 12 -> 16
    assert cli.main(["audit", str(head), "--format", "dot", "--json"]) == 2


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_failed_link_is_red_in_dot_and_names_are_escaped(tmp_path, keys, signer, capsys):
    run_dir = _run(tmp_path / "ck", "r", 8, keys)
    (run_dir / step_dir_name(4) / "model.safetensors").write_bytes(b"damaged")

    def rename(statement: dict) -> None:
        statement["subject"][0]["name"] = 'step-8" -> evil [label="x'

    resign(run_dir / step_dir_name(8), signer, rename)
    code = cli.main(["audit", str(run_dir / step_dir_name(8)), "--format", "dot",
                     "--trusted", str(signer.path.parent)])  # fmt: skip
    dot = capsys.readouterr().out
    assert code == 8
    assert 'color="#c62828", fontcolor="#c62828"' in dot  # the edge into the damaged link
    assert 'step-8\\" -> evil [label=\\"x' in dot  # inside its quoted label
    import pydot

    (parsed,) = pydot.graph_from_dot_data(dot)
    assert [(e.get_source(), e.get_destination()) for e in parsed.get_edges()] == [
        ("n1", "n0"),
        ("n2", "n1"),
    ]  # no edge to "evil"


# -- the drill's picture and page -----------------------------------------------------------


def _journal(run_dir: Path, records: list[dict]) -> None:
    run_dir.mkdir(parents=True)
    (run_dir / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_drill_labels_each_kill_with_its_phase_and_stacks_kills_at_one_step(tmp_path):
    steps = [{"step": s, "loss": 1.0 / s} for s in range(1, 31)]
    _journal(tmp_path / "ref", [{"event": "start"}, *steps])
    resumed = [{"event": "resume", "from": "v/step-00000010", "step": 10, "restored": ["model"]},
               {"event": "resume_health", "status": "ok", "resumed_at": 10}]  # fmt: skip
    _journal(tmp_path / "victim", [{"event": "start"}, *steps[:12], *resumed, *steps[10:]])
    kills = [
        {"point": p, "reached": True, "exit": -9}
        for p in ("commit-write-20", "commit-before-manifest-20", "commit-before-rename-20",
                  "retire-10@20", "step-12", "abandon-20@from-10")
    ]  # fmt: skip
    kills.append({"point": "dvc-push-20", "reached": False, "exit": 0})
    where = {"reference": str(tmp_path / "ref"), "victim": str(tmp_path / "victim")}
    rep = drill_verdict.Report(True, "bitwise", kills, [10, 10], [], 30, 1.0, **where)
    png = drill_verdict.plot(tmp_path, tmp_path / "ref", tmp_path / "victim", rep)
    assert png.read_bytes()[:4] == b"\x89PNG"
    page = report_drill.write(tmp_path, rep).read_text()
    labels = [
        "#1 commit: writing tensors (20)", "#2 commit: before the signature (20)",
        "#3 commit: before the rename (20)", "#4 retention: deleting 10 in the commit of 20",
        "#5 between steps (after step 12)", "#6 branch from step 10: moving step 20 aside",
        "#7 DVC: pushing (20) (never reached)",
    ]  # fmt: skip
    ys = {}
    for label in labels:
        found = re.search(r'<text [^>]*y="([\d.]+)"[^>]*>' + re.escape(label) + "</text>", page)
        assert found, label
        ys[label] = float(found.group(1))
    at_20 = [ys[label] for label in labels if "(20)" in label or "of 20" in label]
    assert len(set(at_20)) == len(at_20) == 5  # five kills at step 20, none over another
    assert "PASS" in page and "resumes of the drilled run" in _text(page).lower()
    assert "<script" not in page


def test_the_drill_command_writes_drill_html_beside_the_png(tmp_path, monkeypatch, capsys):
    from recovery.cli.commands import drill as drill_cli

    _journal(tmp_path / "reference" / "run", [{"step": 1, "loss": 1.0}])
    _journal(tmp_path / "victim" / "run", [{"step": 1, "loss": 1.0}])
    rep = drill_verdict.Report(True, "bitwise", [{"point": "step-1", "reached": True}], [], [],
                               1, 0.1, plot=str(tmp_path / "drill.png"),
                               reference=str(tmp_path / "reference" / "run"),
                               victim=str(tmp_path / "victim" / "run"))  # fmt: skip
    monkeypatch.setattr(drill_cli.drill_command, "run", lambda *a, **k: rep)
    code = cli.main(["drill", "--out", str(tmp_path), "--json", "--", "x", "{run_dir}"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["page"] == str(tmp_path / "drill.html")
    assert "between steps (after step 1)" in (tmp_path / "drill.html").read_text()


def test_a_crafted_lineage_loop_cannot_hang_the_layout():
    g = report_lineage.Graph()
    g.nodes = {k: report_lineage.Node(k, None, "lane", k) for k in "ab"}
    g.edges = [report_lineage.Edge("a", "b", "previous"), report_lineage.Edge("b", "a", "resume")]
    assert set(report_lineage._columns(g)) == {"a", "b"}
    assert "<svg" in report_lineage.picture(g)


def test_a_checkpoint_by_an_untrusted_key_is_a_failure_not_a_signer(tmp_path, keys):
    """The page's signer column comes from verified statements only."""
    from recovery.errors import UntrustedSignerError
    from recovery.integrity.keys.signing import TrustStore

    run_dir = _run(tmp_path / "ck", "r", 4, keys)
    built = report.build(run_dir, TrustStore())  # trusts nothing
    assert built.failures and isinstance(built.failures[0][1], UntrustedSignerError)
    (row,) = built.checkpoints
    assert row.failed and row.signer is None and "FAILED" in row.verdict
