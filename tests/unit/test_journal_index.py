"""The journal's index: what a resume and ``ls`` read does not grow with the run, and the
index never changes what they read (an old journal, an edited one, a forged index)."""

from __future__ import annotations

import json

import pytest

from recovery.config import CheckpointConfig
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal, events, index, read, read_numbered, steps_after
from recovery.run.restoring import history
from tests.conftest import record_and_save, tiny_state


@pytest.fixture
def small(monkeypatch):
    """Segments of 5 lines: a short journal has many."""
    monkeypatch.setattr(index, "SEGMENT_LINES", 5)


def write(path, records, *, close=True):
    j = Journal(path)
    for rec in records:
        j.write(rec)
    if close:
        j.close()
    return j


def run_of(steps, every=10):
    """Per-step records with a checkpoint event every ``every`` steps, and a resume."""
    out = [{"event": "start", "run_id": "r1"}]
    for s in range(1, steps + 1):
        out.append({"step": s, "loss": 1.0 / s})
        if s % every == 0:
            out.append({"event": "checkpoint", "step": s})
    return out


def whole_events(path):
    return [(n, r) for n, r in read_numbered(path) if "event" in r]


def whole_after(path, step):
    return {r["step"]: r for r in read(path) if "event" not in r and r["step"] > step}


def test_segments_cover_the_journal_and_readers_agree_with_a_whole_read(tmp_path, small):
    p = tmp_path / "m.jsonl"
    write(p, run_of(47))
    segs = index.segments_in(index.path_of(p).read_bytes())
    assert len(segs) == 11 and segs[-1].end == p.stat().st_size
    assert [s.line for s in segs] == list(range(1, 52, 5))
    assert events(p) == whole_events(p)
    for step in (0, 13, 40, 47):
        assert steps_after(p, step) == whole_after(p, step)


def test_a_resume_reads_only_the_segments_after_its_checkpoint(tmp_path, small, monkeypatch):
    p = tmp_path / "m.jsonl"
    write(p, run_of(200))
    seen = []
    real = index.parsed
    monkeypatch.setattr(index, "parsed", lambda line: seen.append(line) or real(line))
    after = steps_after(p, 190)
    assert sorted(after) == list(range(191, 201))
    assert len(seen) <= 2 * 5 + 2 * 5  # the segments holding steps 191-200 (and their events)
    seen.clear()
    assert len(events(p)) == 21 and len(seen) == 21  # the event lines, nothing else


def test_several_writers_each_index_what_they_wrote_and_a_killed_ones_tail_is_read(tmp_path, small):
    """A killed writer never indexes its last lines; readers read them, and the next
    writer indexes them at its start, where the segments go on."""
    p = tmp_path / "m.jsonl"
    write(p, run_of(12))
    write(p, [{"event": "resume", "step": 10}, *run_of(23)[12:]], close=False)  # killed
    assert events(p) == whole_events(p)
    assert steps_after(p, 10) == whole_after(p, 10)
    write(p, [{"event": "resume", "step": 20}, {"step": 21, "loss": 0.5}])
    segs = index.segments_in(index.path_of(p).read_bytes())
    assert segs[-1].end == p.stat().st_size
    assert index.mismatch(segs, p.read_bytes(), p.stat().st_size) is None
    assert events(p) == whole_events(p)
    assert steps_after(p, 20) == whole_after(p, 20)


def test_a_journal_without_an_index_reads_whole_and_its_next_writer_indexes_it(tmp_path, small):
    """A journal written before the index existed (or by another tool) reads as before."""
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in run_of(30)))
    with index.view(p) as seen:
        assert seen is None
    assert events(p) == whole_events(p)
    assert steps_after(p, 25) == whole_after(p, 25)
    write(p, [{"event": "resume", "step": 30}])
    with index.view(p) as seen:
        assert seen is not None and seen.tail.start == seen.tail.end == p.stat().st_size
    assert events(p) == whole_events(p)


@pytest.mark.parametrize(
    "edit",
    [
        pytest.param(
            lambda text: text.replace(b'"step":20}', b'"step":29}'), id="an event rewritten"
        ),
        pytest.param(lambda text: text[: len(text) // 2], id="the journal cut short"),
        pytest.param(lambda text: b"\n" + text, id="a line put before the rest"),
    ],
)
def test_an_index_that_does_not_match_its_journal_is_not_used_and_is_rebuilt(tmp_path, small, edit):
    p = tmp_path / "m.jsonl"
    write(p, run_of(30))
    p.write_bytes(edit(p.read_bytes()))
    with index.view(p) as seen:
        assert seen is None
    assert events(p) == whole_events(p)
    write(p, [{"event": "resume", "step": 10}])
    segs = index.segments_in(index.path_of(p).read_bytes())
    assert index.mismatch(segs, p.read_bytes(), p.stat().st_size) is None
    assert events(p) == whole_events(p)


def test_a_torn_last_line_is_skipped_and_the_next_writer_goes_on_after_it(tmp_path, small):
    p = tmp_path / "m.jsonl"
    write(p, run_of(8))
    with p.open("a") as fh:
        fh.write('{"step": 9, "lo')  # power lost mid-line
    assert steps_after(p, 7) == {8: {"step": 8, "loss": 1 / 8}}
    write(p, [{"step": 9, "loss": 0.25}])
    assert steps_after(p, 7) == whole_after(p, 7) == {8: {"step": 8, "loss": 1 / 8},
                                                      9: {"step": 9, "loss": 0.25}}  # fmt: skip
    segs = index.segments_in(index.path_of(p).read_bytes())
    assert index.mismatch(segs, p.read_bytes(), p.stat().st_size) is None


def test_an_index_that_leaves_a_sealed_event_out_cannot_hide_it(tmp_path, small, signer, trust):
    """The chain found through the index breaks where an event is missing: the reader
    reads the whole journal, and finds what it would have without the index."""
    p = tmp_path / "m.jsonl"
    j = Journal(p)
    j.seal_with(signer, trust)
    for rec in run_of(40):
        j.write(rec)
    j.close()
    both = trust.with_signer(signer)
    honest = history.read(p, both)
    assert honest.newest == 40
    ipath = index.path_of(p)
    segs = index.segments_in(ipath.read_bytes())
    hit = next(s for s in segs if any(e[2] > 30 for e in s.events))
    hit.events = [e for e in hit.events if not (30 < e[2] < 40)]  # step 30's checkpoint gone
    ipath.write_text("".join(s.dumps() + "\n" for s in segs))
    with index.view(p) as seen:
        assert seen is not None  # every event it names is there: it is used ...
    assert history.read(p, both) == honest  # ... but the broken chain sends the reader whole


def test_a_resume_after_a_journal_of_many_segments_compares_its_redone_steps(
    tmp_path, small, signer, trust, prov
):
    """A run killed after its last checkpoint (the segment it was writing never indexed)
    resumes through an index of many segments: its history, its checkpoint and its
    self-check's redone steps are the journal's."""
    kw = {"signer": signer, "trust": trust, "provenance": prov, "preemption": False}
    cfg = CheckpointConfig(every_steps=8)
    run = tmp_path / "r"
    state = tiny_state()
    ck = Checkpointer(cfg, run, final_step=40, **kw)
    ck.restore(state)
    record_and_save(ck, state, range(1, 29))
    ck.journal._index = None  # "killed": nothing more reaches the index
    ck.close()
    assert len(index.segments_in(index.path_of(run / "metrics.jsonl").read_bytes())) >= 5
    state = tiny_state()
    with Checkpointer(cfg, run, final_step=40, **kw) as ck:
        assert ck.restore(state, "latest") == 24
        record_and_save(ck, state, range(25, 33))
    checks = [r for r in read(run / "metrics.jsonl") if r.get("event") == "resume_check"]
    assert checks[-1]["status"] == "exact" and checks[-1]["compared"] == 4


def test_a_segment_that_no_longer_lies_on_whole_lines_sends_the_reader_whole(tmp_path, small):
    """An edit that keeps the journal's length and its events but moves a line boundary
    between two segments is found when a segment is read."""
    p = tmp_path / "m.jsonl"
    write(p, [{"step": s, "loss": 0.5} for s in range(1, 16)])
    text = p.read_bytes()
    text = text.replace(b'{"step":7,"loss":0.5}', b'{"step":7,"loss":0.555}')
    text = text.replace(b'{"step":12,"loss":0.5}', b'{"step":12,"loss":5}')
    p.write_bytes(text)
    with index.view(p) as seen:
        assert seen is not None  # the cheap checks pass ...
    assert steps_after(p, 0) == whole_after(p, 0)  # ... reading a segment does not
    assert steps_after(p, 0)[7]["loss"] == 0.555


def test_a_resume_of_an_old_journal_indexes_it_first_and_reads_it_through_the_index(
    tmp_path, small, signer, trust, prov, monkeypatch
):
    """A journal written before the index existed: the resume's writer indexes it once,
    before it reads, and nothing reads it whole."""
    from recovery.run.journal import reading

    kw = {"signer": signer, "trust": trust, "provenance": prov, "preemption": False}
    run = tmp_path / "r"
    state = tiny_state()
    with Checkpointer(CheckpointConfig(every_steps=4), run, final_step=20, **kw) as ck:
        ck.restore(state)
        record_and_save(ck, state, range(1, 11))
    index.path_of(run / "metrics.jsonl").unlink()  # as an older version left it
    wholes = []
    real = reading.read_numbered
    monkeypatch.setattr(reading, "read_numbered", lambda p: wholes.append(p) or real(p))
    state = tiny_state()
    with Checkpointer(CheckpointConfig(every_steps=4), run, final_step=20, **kw) as ck:
        assert ck.restore(state, "latest") == 8
        record_and_save(ck, state, range(9, 13))
    assert not wholes
    checks = [r for r in read(run / "metrics.jsonl") if r.get("event") == "resume_check"]
    assert checks[-1]["status"] == "exact" and checks[-1]["compared"] == 2
    with index.view(run / "metrics.jsonl") as seen:
        assert seen is not None and seen.tail.start == seen.tail.end


def test_odd_lines_read_the_same_through_the_index_and_whole(tmp_path, small):
    """A line ends at a newline only, in both reads: a lone CR (JSON whitespace) and a raw
    U+2028 in a string do not end one; a form feed, a BOM or bytes that are not UTF-8
    make a line malformed in both."""
    from recovery.run.journal import segmenter

    p = tmp_path / "m.jsonl"
    raw = [
        b'{"event":"start","run_id":"a"}',
        b'{"step":1,"loss":1}',
        '{"event":"note","text":"a\u2028b"}'.encode(),
        b'{"step":2,\r"loss":2}',
        b'{"step":3,"loss":3}\x0c',
        b"\xef\xbb\xbf" + b'{"step":4,"loss":4}',
        b'{"step":5,"loss":"\xff"}',
        b'{"event":"checkpoint","step":5}',
        b'{"step":6,"loss":6}',
    ]
    p.write_bytes(b"\n".join(raw) + b"\n")
    segmenter.catch_up(p)
    with index.view(p) as seen:
        assert seen is not None and len(seen.segments) == 2
    assert events(p) == whole_events(p) == [(1, raw_event(raw[0])), (3, raw_event(raw[2])),
                                              (8, raw_event(raw[7]))]  # fmt: skip
    assert steps_after(p, 0) == whole_after(p, 0)
    assert sorted(steps_after(p, 0)) == [1, 2, 6]  # a form feed is no JSON whitespace


def raw_event(line):
    return json.loads(line.decode())


@pytest.mark.parametrize("forgery", ["steps not a range", "a step line named an event"])
def test_a_forged_index_is_not_believed(tmp_path, small, forgery):
    p = tmp_path / "m.jsonl"
    write(p, run_of(30))
    ipath = index.path_of(p)
    lines_ = [json.loads(x) for x in ipath.read_text().splitlines()]
    if forgery == "steps not a range":
        lines_[2]["steps"] = ["a", "b"]
    else:  # the second segment's first line, a per-step record, listed with its digest
        data = p.read_bytes()
        at = lines_[1]["from"]
        end = data.index(b"\n", at)
        lines_[1]["events"].insert(0, [at, end - at, lines_[1]["line"], index.digest(data[at:end])])
    ipath.write_text("".join(json.dumps(x) + "\n" for x in lines_))
    assert events(p) == whole_events(p)
    assert steps_after(p, 12) == whole_after(p, 12)
