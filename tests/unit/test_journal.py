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
