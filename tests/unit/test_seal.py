"""Sealed journal events: a resume obeys only the steering events this run's writer signed,
in the order it wrote them."""

import json
import shutil

import pytest

from recovery.errors import RollbackError
from recovery.format.layout import step_dir_name
from recovery.integrity.keys import seal
from recovery.integrity.keys.signing import TrustStore
from recovery.run.journal import Journal, read, read_numbered
from recovery.run.restoring import history
from tests.conftest import make_signer
from tests.unit.test_checkpointer import _keys, run  # noqa: F401 - _keys: an autouse fixture

START = {"event": "start", "run_id": "a"}


def chain(signer, *records):
    """``records`` sealed one after the other, as a journal writes them."""
    out, tip = [], ""
    for r in records:
        if seal.steers(r):
            r = seal.seal(r, tip, signer)
            tip = seal.link(r)
        out.append(r)
    return out


def ck(step):
    return {"event": "checkpoint", "step": step}


def tamper(records, i, **fields):
    records = list(records)
    records[i] = {**records[i], **fields}
    return records


@pytest.mark.parametrize(
    ("attack", "obeyed_steps", "refused"),
    [
        ("none", [2, 4, 6], []),
        ("appended_unsigned", [2, 4, 6], ["retired: unsigned"]),
        ("altered_field", [2], ["checkpoint: does not verify", "checkpoint: not chained"]),
        ("removed_middle", [2], ["checkpoint: not chained"]),
        ("reordered", [2, 4], ["checkpoint: not chained"]),
        ("foreign_key", [2, 4, 6], ["retired: not trusted"]),
        ("copied_from_another_journal", [2, 4, 6], ["retired: not chained"]),
        ("malformed_seal", [2, 4, 6], ["retired: malformed"]),
    ],
)
def test_only_sealed_and_chained_steering_events_are_obeyed(
    attack, obeyed_steps, refused, signer, trust, tmp_path
):
    good = chain(signer, START, ck(2), {"step": 3, "loss": 1.0}, ck(4), ck(6))
    retire = {"event": "retired", "steps": [6]}
    records = {
        "none": good,
        "appended_unsigned": [*good, retire],
        "altered_field": tamper(good, 3, step=8),
        "removed_middle": [*good[:3], good[4]],
        "reordered": [good[0], good[1], good[2], good[4], good[3]],
        "foreign_key": [*good, seal.seal(retire, seal.link(good[-1]), make_signer(tmp_path))],
        # the same writer's retired event, sealed in another journal (another chain)
        "copied_from_another_journal": [*good, chain(signer, START, retire)[1]],
        "malformed_seal": [*good, {**retire, "auth": {"key": signer.key_id, "sig": "%%"}}],
    }[attack]
    checked = seal.check(enumerate(records, 1), trust)
    h = history.from_records(checked.obeyed)
    assert sorted(h.committed) == obeyed_steps
    assert 6 not in h.retired  # no unauthenticated retirement hides a commit
    words = {
        "unsigned": "unsigned",
        "does not verify": "does not verify",
        "not chained": "not chained",
        "not trusted": "not trusted",
        "malformed": "malformed",
    }
    got = [f"{r.event}: {next(w for w in words if words[w] in r.why)}" for r in checked.refused]
    assert got == refused
    assert {"step": 3, "loss": 1.0} in checked.obeyed  # per-step records are not sealed


def sealed_journal(path, signer, trust, *records):
    """A journal at ``path`` holding ``records``, written as a run's writer writes them."""
    j = Journal(path)
    j.seal_with(signer, trust)
    for r in records:
        j.write(r)
    j.close()


def test_a_journal_chains_on_after_a_refused_line_and_history_warns_once(
    tmp_path, signer, trust, caplog
):
    path = tmp_path / "metrics.jsonl"
    sealed_journal(path, signer, trust, START, ck(2))
    with open(path, "a") as fh:  # someone else's line
        fh.write(json.dumps({"event": "retired", "steps": [2]}) + "\n")
    j = Journal(path)  # the next writer: chains onto the last event that verifies
    j.seal_with(signer, trust)
    j.write(ck(4))
    j.write({"step": 5, "loss": 0.5})
    j.close()
    checked = seal.check(read_numbered(path), trust)
    assert [r.line for r in checked.refused] == [3]
    for _ in range(2):  # read twice (a resume falling back reads it again): one warning
        h = history.read(path, trust)
        assert sorted(h.committed) == [2, 4] and not h.retired
    assert caplog.text.count("JOURNAL EVENTS IGNORED") == 1
    assert "line 3 ('retired'): unsigned" in caplog.text


def test_a_writer_seals_what_steers_and_nothing_else(tmp_path, signer):
    run(tmp_path, 6, every=2, keep_last=2)
    records = read(tmp_path / "run" / "metrics.jsonl")
    sealed = {r["event"] for r in records if "auth" in r}
    assert sealed == {"start", "checkpoint", "retired"}
    assert all("auth" not in r for r in records if not seal.steers(r))
    assert not seal.check(enumerate(records, 1), TrustStore().with_signer(signer)).refused


def test_a_forged_retirement_does_not_hide_a_rollback(tmp_path, caplog):
    run(tmp_path, 6, keep_last=3)
    run_dir = tmp_path / "run"
    shutil.rmtree(run_dir / step_dir_name(6))
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "retired", "steps": [6]}) + "\n")
    with pytest.raises(RollbackError, match="committed step 6"):
        run(tmp_path, 8, resume="latest", strict_resume=True)
    assert "JOURNAL EVENTS IGNORED" in caplog.text and "'retired'" in caplog.text


def test_a_broken_chain_hides_no_commit_and_a_strange_line_breaks_nothing(
    tmp_path, signer, trust, caplog
):
    path = tmp_path / "metrics.jsonl"
    sealed_journal(path, signer, trust, START, *({**ck(s), "run_id": "a"} for s in (2, 4, 6)))
    lines = path.read_text().splitlines()
    lines[1] = lines[1].replace('"step":2', '"step":3')  # one byte of the first commit
    other = seal.seal({**ck(8), "run_id": "b"}, "", signer)  # another run's, same key
    lines += [json.dumps({"event": ["x"]}), json.dumps(other)]  # an unhashable event too
    path.write_text("\n".join(lines) + "\n")
    h = history.read(path, trust)
    # every commit after the altered one is out of the chain, and still counts: the
    # newest commit of run a is 6, so a resume from anything older is a rollback
    assert h.run_id == "a" and sorted(h.committed) == [4, 6] and h.newest == 6
    assert "('checkpoint'): its signature does not verify" in caplog.text
