"""The local tier (checkpoint.local, recovery.run.tiers.rules): its policies as tables, and in
process: promotion, resume across tiers, a damaged snapshot's fallback, the RAM check."""

import json
from pathlib import Path

import pytest
import torch

from recovery.config import LocalConfig
from recovery.errors import ConfigError, RunDirInUseError, StorageError
from recovery.format.layout import scan, step_dir_name
from recovery.run.journal import read
from recovery.run.restoring import choose
from recovery.run.tiers import rules
from recovery.run.tiers.rules import LOCAL, PERSISTENT
from tests.conftest import tiny_state, train_steps
from tests.unit.tiered import checkpointer, crash_at

P, L = Path("/p"), Path("/l")


@pytest.mark.parametrize(
    ("persistent", "local", "expected"),
    [
        ([], [], []),
        ([6], [], [(6, PERSISTENT)]),
        ([6], [8], [(8, LOCAL), (6, PERSISTENT)]),  # newest first, whichever tier
        ([6, 12], [8], [(12, PERSISTENT), (8, LOCAL), (6, PERSISTENT)]),
        ([6], [6], [(6, LOCAL), (6, PERSISTENT)]),  # one step in both: RAM first
        ([], [2, 4], [(4, LOCAL), (2, LOCAL)]),
    ],
)
def test_latest_tries_the_newest_step_first_and_local_first_at_a_step(persistent, local, expected):
    got = rules.order([(s, P / str(s)) for s in persistent], [(s, L / str(s)) for s in local])
    assert [(c.step, c.tier) for c in got] == expected
    assert all(c.path == (L if c.tier == LOCAL else P) / str(c.step) for c in got)
    assert got == sorted(got, key=lambda c: -c.step)


@pytest.mark.parametrize(
    ("held", "newest", "pinned", "gone"),
    [
        ([2, 4], 4, set(), [2]),  # the previous one goes once the next committed
        ([4], 4, set(), []),
        ([2, 4, 6], 6, {2}, [4]),  # a promotion is copying 2
        # a later one stays: under torchrun a step retires its elders once the peers hold
        # it, and the next may have committed by then (another branch's go at the start)
        ([2, 4], 2, set(), []),
        ([2, 4, 6], 4, {6}, [2]),
    ],
)
def test_retire_keeps_the_newest_and_what_a_promotion_copies(held, newest, pinned, gone):
    assert rules.retire([(s, L / str(s)) for s in held], newest, pinned) == [
        L / str(s) for s in gone
    ]


@pytest.mark.parametrize(
    ("held", "released", "pinned"),
    [
        ([6, 6], [6], {6}),  # a promotion and a copy to peers: one done, the other reads on
        ([6, 6], [6, 6], set()),
        ([6, 8], [6], {8}),
        ([6], [6, 6], set()),  # released once more than held: not pinned, never negative
    ],
)
def test_a_step_stays_pinned_while_any_of_its_readers_holds_it(held, released, pinned):
    pins = rules.Pins()
    for step in held:
        pins.add(step)
    for step in released:
        pins.discard(step)
    assert {s for s in (6, 8) if s in pins} == pinned
    on_disk = [(s, L / str(s)) for s in (6, 8, 10)]
    assert rules.retire(on_disk, 10, pins) == [L / str(s) for s in (6, 8) if s not in pinned]


def test_a_restart_discards_snapshots_of_steps_after_it():
    held = [(s, L / str(s)) for s in (2, 4, 6)]
    assert rules.newer(held, 4) == [L / "6"]
    assert rules.newer(held, 6) == []


@pytest.mark.parametrize(
    ("size", "free", "fits"),
    [(100, 300, True), (100, 299, False), (0, 0, True), (1 << 30, 4 << 30, True)],
)
def test_room_needs_held_snapshots(size, free, fits):
    why = rules.room(size, free)
    assert (why is None) == fits
    if not fits:
        assert "3 snapshots" in why


@pytest.mark.parametrize(
    ("cost", "local_cost", "host_loss", "local", "persistent", "lost_two"),
    [
        # 60 s per persistent checkpoint, MTBF 24 h: one tier every 53.7 min loses 26.8 min
        (60, 2, 0.1, 619.7, 10182.3, 788.0),  # 0.9 * 619.7 / 2 + 0.1 * 10182.3 / 2
        (60, 2, 0.5, 831.4, 4553.7, 1346.3),  # half the failures lose the node: little gain
        (60, 60, 0.1, 3394.1, 10182.3, 2036.5),  # a snapshot as dear as a save: a loss
    ],
)
def test_young_daly_per_tier_and_the_work_lost_per_failure(
    cost, local_cost, host_loss, local, persistent, lost_two
):
    got = rules.plan(cost, local_cost, 86400, host_loss)
    assert got["one_tier_interval_s"] == pytest.approx(3219.9, abs=0.1)
    assert got["one_tier_loss_per_failure_s"] == pytest.approx(1610.0, abs=0.1)
    assert got["local_interval_s"] == pytest.approx(local, abs=0.1)
    assert got["persistent_interval_s"] == pytest.approx(persistent, abs=0.1)
    assert got["two_tier_loss_per_failure_s"] == pytest.approx(lost_two, abs=0.1)
    assert got["fewer_lost"] == pytest.approx(1610.0 / lost_two, rel=1e-4)
    day_cost = local_cost * 86400 / local + cost * 86400 / persistent
    assert got["two_tier_checkpoint_cost_per_day_s"] == pytest.approx(day_cost, rel=1e-4)


def test_plan_compares_one_tier_with_two(capsys):
    from recovery import cli

    argv = ["plan", "--cost", "60s", "--mtbf", "24h", "--local-cost", "2s"]
    assert cli.main([*argv, "--json"]) == 0
    two = json.loads(capsys.readouterr().out)["tiers"]
    assert two["local_interval_s"] == pytest.approx(619.7, abs=0.1)
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "local 10.3m, persistent 2.83h" in text and "2.04x less work lost" in text
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--host-loss", "1"])
    assert exit_.value.code == 2
    assert "argument --host-loss: expected a share between 0 and 1" in capsys.readouterr().err


def test_the_local_directory_is_per_run_directory_and_rank(tmp_path):
    a = rules.local_dir("/dev/shm/recovery", tmp_path / "a" / "run", 0)
    assert a.parent.parent == Path("/dev/shm/recovery") and a.name == "rank0"
    assert a.parent.name.startswith("run-")
    assert rules.local_dir("/dev/shm/recovery", tmp_path / "b" / "run", 0) != a
    assert rules.local_dir("/dev/shm/recovery", tmp_path / "a" / "run", 1).parent == a.parent


def test_refused_with_what_it_does_not_support_yet():
    rules.check_supported(differential=False)
    with pytest.raises(ConfigError, match="checkpoint.differential"):
        rules.check_supported(differential=True)
    with pytest.raises(ConfigError, match="checkpoint.local.every_steps"):
        LocalConfig(every_steps=-1)


@pytest.mark.parametrize("async_save", [False, True], ids=["sync", "async"])
def test_latest_resumes_the_newer_local_snapshot_and_promotes_it(
    tmp_path, signer, trust, prov, async_save
):
    """With checkpoint.async the training thread only copies into staging buffers; the
    snapshot is written (then promoted) in the background: the same checkpoints."""
    ck, params = crash_at(tmp_path, signer, trust, prov, 8, async_save=async_save)
    assert [s for s, _ in scan(ck.run_dir).committed] == [6]
    assert [s for s, _ in ck.local.held()] == [8]  # 2, 4 and 6 retired as each next committed
    journal = read(ck.run_dir / "metrics.jsonl")
    snapshots = [r for r in journal if r.get("event") == "snapshot"]
    # async: a snapshot due while the previous one is still written is skipped, and counted
    assert [r["step"] for r in snapshots][-2:] == [6, 8]  # a promoted one is never skipped
    assert len(snapshots) + sum(r.get("skipped", 0) for r in snapshots) == 4
    assert async_save or [r["step"] for r in snapshots] == [2, 4, 6, 8]
    promoted = [r for r in journal if r.get("event") == "checkpoint"]
    assert [(r["step"], r["mode"], r["promoted_from"]) for r in promoted] == [
        (6, "promoted", "local")
    ]
    # interval=auto plans the persistent tier with the promotion's write, not the snapshot's pause
    assert ck.cadence.costs == [promoted[0]["write_s"]] != [promoted[0]["pause_s"]]
    # the persistent copy holds the snapshot's files: the same root digest, signed again
    six = choose.load(ck.run_dir / step_dir_name(6), trust)
    assert six.manifest.recovery.get("promoted") is True and "tier" not in six.manifest.recovery

    state = tiny_state()
    with torch.no_grad():  # what the resume must overwrite
        for t in state.components["model"].parameters():
            t.add_(1.0)
    again = checkpointer(tmp_path, signer, trust, prov, final=12)
    assert again.restore(state, "latest") == 8
    again.flush()  # the resumed snapshot's promotion
    got = [t for t in state.components["model"].parameters()]
    assert all(torch.equal(a, b) for a, b in zip(params, got, strict=True))
    event = [r for r in read(ck.run_dir / "metrics.jsonl") if r.get("event") == "resume"][-1]
    assert (event["step"], event["tier"]) == (8, LOCAL)
    assert [s for s, _ in scan(ck.run_dir).committed] == [6, 8]
    eight = choose.load(ck.run_dir / step_dir_name(8), trust)
    assert eight.manifest.root == again.identity.previous["sha256"]
    assert again.identity.lineage[-1]["from"]["tier"] == LOCAL
    again.close()  # 8 is persistent now: the local directory goes
    assert not again.local.dir.exists()


def test_a_damaged_local_snapshot_falls_back_to_the_persistent_tier(
    tmp_path, signer, trust, prov, caplog
):
    ck, _ = crash_at(tmp_path, signer, trust, prov, 8)
    (snap,) = [p for _, p in ck.local.held()]
    model = snap / "model.safetensors"
    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    model.write_bytes(bytes(data))
    fresh = checkpointer(tmp_path, signer, trust, prov, final=12)
    with pytest.raises(RunDirInUseError):  # no fresh start over a used run
        fresh.restore(tiny_state(), None)
    again = checkpointer(tmp_path, signer, trust, prov, final=12)
    assert again.restore(tiny_state(), "latest") == 6
    assert "RESUME FALLBACK: skipping" in caplog.text and str(snap) in caplog.text
    event = [r for r in read(ck.run_dir / "metrics.jsonl") if r.get("event") == "resume"][-1]
    assert (event["tier"], event["skipped"]) == (PERSISTENT, [str(snap)])
    assert not snap.exists()  # step 8 of the branch it did not continue: removed
    again.close()


def test_a_local_tier_that_would_not_fit_is_refused_in_one_line_before_the_first_step(
    tmp_path, signer, trust, prov, monkeypatch
):
    ck = checkpointer(tmp_path, signer, trust, prov)
    real = rules.shutil.disk_usage
    monkeypatch.setattr(
        rules.shutil, "disk_usage", lambda p: real(p)._replace(free=1000)
    )  # a /dev/shm of 1000 bytes
    with pytest.raises(StorageError, match=r"^checkpoint.local.root: the local tier in .* needs"):
        ck.restore(tiny_state(), "latest")
    ck.close()
    assert not ck._restorer.locked  # refused: the run directory is free again


def test_ls_and_audit_show_the_local_snapshots_and_the_resume_s_tier(
    tmp_path, signer, trust, prov, capsys
):
    from recovery import cli

    ck, _ = crash_at(tmp_path, signer, trust, prov, 8)
    argv = ["ls", str(ck.run_dir), "--trusted", str(signer.path.parent)]
    assert cli.main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["checkpoints"]
    assert [(r["step"], r["tier"], r["verified"]) for r in rows] == [
        (6, PERSISTENT, True),
        (8, LOCAL, True),
    ]
    state = tiny_state()
    again = checkpointer(tmp_path, signer, trust, prov, final=12)
    assert again.restore(state, "latest") == 8
    for step in range(9, 13):
        train_steps(state, 1)
        again.maybe_save(state, step)
    again.close()  # after step 12's promotion committed: the local directory goes
    assert not again.local.dir.exists()
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "resumed at step 8 from step-00000008 (local tier)" in text
    # the audit walks the resume's link to the snapshot's persistent copy (one digest)
    twelve = ck.run_dir / step_dir_name(12)
    assert cli.main(["audit", str(twelve), "--trusted", str(signer.path.parent)]) == 0
    assert "<- resume (from the local tier): step-00000008" in capsys.readouterr().out


def test_a_fresh_run_refuses_a_run_directory_whose_local_tier_holds_snapshots(
    tmp_path, signer, trust, prov
):
    ck, _ = crash_at(tmp_path, signer, trust, prov, 4)  # killed before its first promotion
    assert scan(ck.run_dir).committed == [] and [s for s, _ in ck.local.held()] == [4]
    fresh = checkpointer(tmp_path, signer, trust, prov, final=12)
    with pytest.raises(RunDirInUseError, match=r"holds local snapshots up to step 4 .*resume"):
        fresh.restore(tiny_state(), None)
    fresh.close()
    assert [s for s, _ in ck.local.held()] == [4]  # untouched
