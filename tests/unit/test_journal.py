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
