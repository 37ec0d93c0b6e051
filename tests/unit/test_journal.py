from recovery.run.journal import Journal, effective_steps, read


def test_last_record_of_each_step_wins_and_torn_line_is_skipped(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    j = Journal(path)
    for s in (1, 2, 3):
        j.write({"step": s, "loss": float(s)})
    j.close()
    with open(path, "a") as fh:
        fh.write('{"step": 4, "lo')  # torn by a crash
    j = Journal(path)
    j.write({"event": "resume", "step": 2})
    j.write({"step": 3, "loss": 30.0})
    j.close()
    assert [r.get("event") for r in read(path)] == [None, None, None, "resume", None]
    eff = effective_steps(path)
    assert sorted(eff) == [1, 2, 3]
    assert eff[3]["loss"] == 30.0


def test_watchers_see_each_per_step_record_and_add_only_what_it_lacks(tmp_path):
    seen = []

    class Tap:
        def annotate(self, record):
            return {"lr": 0.5, "loss": -1.0}

        def observed(self, record):
            seen.append(record)

    for path in (tmp_path / "m.jsonl", None):  # ranks > 0 discard, but are watched too
        seen.clear()
        journal = Journal(path)
        tap = Tap()
        journal.watch(tap)
        journal.step(1, loss=2.0)
        journal.write({"event": "checkpoint", "step": 1})  # an event is not a per-step record
        journal.unwatch(tap)
        journal.step(2, loss=3.0)
        journal.close()
        assert seen == [{"step": 1, "loss": 2.0, "lr": 0.5}]
    assert read(tmp_path / "m.jsonl") == [
        {"step": 1, "loss": 2.0, "lr": 0.5},
        {"event": "checkpoint", "step": 1},
        {"step": 2, "loss": 3.0},
    ]


def test_observers_see_every_record_and_the_close_once_and_a_failing_one_is_dropped(
    tmp_path, caplog
):
    seen, ends = [], []

    class Observer:
        def seen(self, record):
            seen.append(record)

        def closed(self):
            ends.append(True)

    class Broken:
        def seen(self, record):
            raise ConnectionError("tracking server down")

        def closed(self):
            raise AssertionError("a dropped observer is not told the end")

    journal = Journal(tmp_path / "m.jsonl")
    journal.tap(Broken())
    journal.tap(Observer())
    journal.write({"event": "start", "run_id": "a"})
    journal.step(1, loss=2.0)
    journal.close()
    journal.close()
    journal.write({"step": 2, "loss": 1.0})  # after the close: neither written nor seen
    assert seen == [{"event": "start", "run_id": "a"}, {"step": 1, "loss": 2.0}]
    assert ends == [True]
    assert [r.message for r in caplog.records].count(
        next(r.message for r in caplog.records if "tracking server down" in r.message)
    ) == 1
    assert len(read(tmp_path / "m.jsonl")) == 2


def test_a_resume_reads_the_events_once_never_the_whole_journal_and_chains_onto_the_tip(
    tmp_path, monkeypatch, signer, trust, prov
):
    """The start's history read finds the sealed chain's tip through the index; the
    journal chains the resume's events onto it without reading them again, nothing reads
    the whole journal, and the chain verifies."""
    from recovery.config import CheckpointConfig
    from recovery.integrity.keys import seal
    from recovery.run.checkpointer import Checkpointer
    from recovery.run.journal import reading
    from tests.conftest import record_and_save, tiny_state

    kw = {"signer": signer, "trust": trust, "provenance": prov, "preemption": False}
    state = tiny_state()
    with Checkpointer(CheckpointConfig(every_steps=2), tmp_path / "r", final_step=6, **kw) as ck:
        ck.restore(state)
        record_and_save(ck, state, range(1, 5))
    reads, wholes = [], []
    real, real_whole = reading.events, reading.read_numbered
    monkeypatch.setattr(reading, "events", lambda p, **k: reads.append(p) or real(p, **k))
    monkeypatch.setattr(reading, "read_numbered", lambda p: wholes.append(p) or real_whole(p))
    state = tiny_state()
    with Checkpointer(CheckpointConfig(every_steps=2), tmp_path / "r", final_step=6, **kw) as ck:
        assert ck.restore(state, "latest") == 4
        assert len(reads) == 1 and not wholes  # the history's read of the events, nothing else
        record_and_save(ck, state, range(5, 7))
    checked = seal.check(real_whole(tmp_path / "r" / "metrics.jsonl"), trust.with_signer(signer))
    assert not checked.refused and not checked.stray
    assert {r.get("event") for r in checked.obeyed} >= {"start", "resume", "checkpoint"}
