import pytest
import torch

from recovery.config import CheckpointConfig
from recovery.errors import (
    CheckpointNotFoundError,
    DriftError,
    IncompatibleStateError,
    PurposeError,
    RunDirInUseError,
    TruncatedFileError,
)
from recovery.format.layout import scan, step_dir_name
from recovery.provenance import capture as provenance
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal, read
from tests.conftest import tiny_state, train_steps

KEYS: dict = {}


@pytest.fixture(autouse=True)
def _keys(signer, trust, prov):
    KEYS.update(signer=signer, trust=trust, provenance=prov)


def run(
    tmp_path,
    steps,
    *,
    every=2,
    keep_last=2,
    keep_every=0,
    resume=None,
    init_from=None,
    state=None,
    config=None,
    prov=None,
    run="run",
    **cfg,
):
    state = state or tiny_state()
    journal = Journal(tmp_path / run / "metrics.jsonl")
    ck = Checkpointer(
        CheckpointConfig(
            root=str(tmp_path), every_steps=every, keep_last=keep_last, keep_every=keep_every, **cfg
        ),
        tmp_path / run,
        final_step=steps,
        journal=journal,
        signer=KEYS["signer"],
        trust=KEYS["trust"],
        provenance=prov or KEYS["provenance"],
        config=config or {"seed": 0, "lr": 0.1},
        model_config={"width": 4},
    )
    step = ck.restore(state, resume, init_from=init_from)
    losses = {}
    while step < steps:
        (loss,) = train_steps(state, 1)
        step += 1
        losses[step] = loss
        ck.maybe_save(state, step, metrics={"loss": loss})
    ck.close()
    journal.close()
    return state, losses, ck


def params(state):
    return state.components["model"].state_dict()


def test_resume_latest_continues_exactly(tmp_path):
    ref, ref_losses, _ = run(tmp_path / "a", 9)
    b_dir = tmp_path / "b"
    run(b_dir, 5)  # saves 2, 4 and 5 (its final)
    # pretend the run had been asked for 9 steps: resume from step 5
    state, losses, ck = run(b_dir, 9, resume="latest")
    assert ck.resumed_from.name == step_dir_name(5)
    assert losses == {s: v for s, v in ref_losses.items() if s > 5}
    assert all(torch.equal(params(ref)[k], params(state)[k]) for k in params(ref))
    events = [r for r in read(b_dir / "run" / "metrics.jsonl") if r.get("event") == "resume"]
    assert events[0]["step"] == 5


def test_retention_keeps_last_and_milestones(tmp_path):
    run(tmp_path, 12, every=2, keep_last=2, keep_every=4)
    assert [s for s, _ in scan(tmp_path / "run").committed] == [4, 8, 10, 12]


def test_fresh_run_refuses_a_used_run_dir(tmp_path):
    run(tmp_path, 4)
    with pytest.raises(RunDirInUseError, match="resume=latest"):
        run(tmp_path, 4)


def test_latest_falls_back_past_corruption(tmp_path, caplog):
    run(tmp_path, 6, keep_last=3)
    newest = tmp_path / "run" / step_dir_name(6)
    f = newest / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 0xFF
    f.write_bytes(bytes(data))
    _, _, ck = run(tmp_path, 6, resume="latest")
    assert ck.resumed_from.name == step_dir_name(4)
    assert "RESUME FALLBACK" in caplog.text and "model.safetensors" in caplog.text


def test_named_step_must_verify(tmp_path):
    run(tmp_path, 6, keep_last=3)
    (tmp_path / "run" / step_dir_name(6) / "state.json").write_text("{}")
    with pytest.raises(TruncatedFileError):
        run(tmp_path, 6, resume=6)
    with pytest.raises(CheckpointNotFoundError, match=r"committed steps: \[2, 4, 6\]"):
        run(tmp_path, 6, resume=3)


def test_resume_latest_with_nothing_starts_fresh(tmp_path, caplog):
    _, losses, ck = run(tmp_path, 3, resume="latest")
    assert ck.resumed_from is None and sorted(losses) == [1, 2, 3]
    assert "starting a fresh run" in caplog.text


def test_resume_by_path(tmp_path):
    run(tmp_path, 4)
    _, losses, _ = run(tmp_path, 6, resume=str(tmp_path / "run" / step_dir_name(4)))
    assert sorted(losses) == [5, 6]


def test_drift_is_warned_recorded_and_strict_refuses(tmp_path, caplog):
    run(tmp_path, 4)
    changed = {**KEYS["provenance"], "dataset": {"version": "sha256:other"}}
    with pytest.raises(DriftError) as err:
        run(
            tmp_path,
            6,
            resume="latest",
            config={"seed": 0, "lr": 0.2},
            prov=changed,
            strict_resume=True,
        )
    assert "config: lr: 0.1 -> 0.2" in err.value.differences
    assert any(d.startswith("dataset: ") for d in err.value.differences)
    run(tmp_path, 6, resume="latest", config={"seed": 0, "lr": 0.2}, prov=changed)
    assert "DRIFT since step-00000004: config: lr: 0.1 -> 0.2" in caplog.text
    from recovery.run.restoring import choose as resume_mod

    newest = resume_mod.load(tmp_path / "run" / step_dir_name(6), KEYS["trust"])
    assert "config: lr: 0.1 -> 0.2" in newest.manifest.recovery["lineage"][-1]["drift"]
    assert "config: lr: 0.1 -> 0.2" in newest.manifest.recovery["provenance"]["drift"]


def test_warm_start_is_a_new_run_with_the_source_as_parent(tmp_path):
    _, _, src = run(tmp_path, 4, run="src")
    source = tmp_path / "src" / step_dir_name(4)
    state, losses, ck = run(tmp_path, 3, init_from=str(source), run="new")
    assert sorted(losses) == [1, 2, 3]  # step 0, fresh schedule and sampler
    assert ck.run_id != src.run_id
    assert (
        ck.identity.parent["kind"] == "warm_start"
        and ck.identity.parent["path"] == "src/step-00000004"
    )
    assert [s["kind"] for s in ck.identity.lineage] == ["start", "warm_start"]
    fresh = tiny_state()
    train_steps(fresh, 3)  # same init seed and data, but not warm-started
    assert not torch.equal(
        fresh.components["model"].state_dict()["0.weight"],
        state.components["model"].state_dict()["0.weight"],
    )


def test_warm_start_of_a_different_model_lists_mismatches(tmp_path):
    run(tmp_path, 2, run="src")
    with pytest.raises(IncompatibleStateError, match="checkpoint shape"):
        run(
            tmp_path,
            2,
            init_from=str(tmp_path / "src" / step_dir_name(2)),
            run="new",
            state=tiny_state(width=7),
        )


def test_warm_start_artifacts_at_milestones(tmp_path):
    run(tmp_path, 6, warm_start_every=3)
    ws = tmp_path / "run" / "warm_start"
    assert sorted(p.name for p in ws.iterdir()) == [step_dir_name(3), step_dir_name(6)]
    from recovery.run.restoring import choose as resume_mod

    loaded = resume_mod.load(ws / step_dir_name(3), KEYS["trust"])
    assert loaded.manifest.purpose == "warm_start"
    assert set(loaded.components) == {"model", "model_config", "provenance", "config", "lineage"}
    # resume refuses it, naming what it lacks; warm start accepts it
    with pytest.raises(PurposeError, match="lacks .*optimizer"):
        run(tmp_path, 8, resume=str(ws / step_dir_name(3)), run="other")
    run(tmp_path, 2, init_from=str(ws / step_dir_name(3)), run="other2")


def test_secret_config_values_never_reach_the_checkpoint(tmp_path):
    config, keys = provenance.redact(
        {
            "seed": 0,
            "db": {"password": "hunter2-SECRET", "url": "postgresql://app:hunter2-SECRET@host"},
            "api_token": "tok-SECRET",
            "hosts": ["a", "b?auth=tok-SECRET"],
        }
    )
    assert config["db"]["url"] == f"postgresql://app:{provenance.REDACTED}@host"
    assert sorted(keys) == ["api_token", "db.password", "db.url", "hosts[1]"]
    run(tmp_path, 2, config=config)
    for f in (tmp_path / "run").rglob("*"):
        if f.is_file():
            assert b"SECRET" not in f.read_bytes(), f


def test_keep_best_is_an_independent_copy_that_resume_best_reloads(tmp_path):
    probe = torch.linspace(-1, 1, 12).reshape(4, 3)

    def score(state):
        with torch.no_grad():
            return float(state.components["model"].eval()(probe).sum())

    state = tiny_state()
    journal = Journal(tmp_path / "run" / "metrics.jsonl")
    ck = Checkpointer(
        CheckpointConfig(
            root=str(tmp_path),
            every_steps=2,
            keep_last=2,
            keep_best=True,
            best_metric="probe",
            best_mode="max",
        ),
        tmp_path / "run",
        final_step=12,
        journal=journal,
        signer=KEYS["signer"],
        trust=KEYS["trust"],
        provenance=KEYS["provenance"],
        config={"seed": 0},
    )
    ck.restore(state, None)
    scores = {}
    for step in range(1, 13):
        train_steps(state, 1)
        state.components["model"].train()
        scores[step] = score(state)
        state.components["model"].train()
        bonus = 0.0 if step == 4 else -100.0  # make step 4 the best, so later saves follow it
        ck.maybe_save(state, step, metrics={"probe": scores[step] + bonus})
    ck.close()
    journal.close()
    best_step = 4
    kept = tmp_path / "run" / "best" / step_dir_name(best_step)
    assert [p.name for p in (tmp_path / "run" / "best").iterdir()] == [kept.name]
    before = {f.name: f.read_bytes() for f in kept.iterdir()}
    # later training and retention leave it alone; it is not a link into the run's files
    assert all(f.stat().st_nlink == 1 for f in kept.iterdir())
    _, _, ck2 = run(tmp_path, 12, resume="best")
    assert ck2.resumed_from == kept
    assert {f.name: f.read_bytes() for f in kept.iterdir()} == before
    reloaded = tiny_state()
    from recovery.run.restoring import choose as resume_mod

    reloaded.load_state_dict(resume_mod.load(kept, KEYS["trust"]).decoded.tree)
    assert score(reloaded) == scores[best_step]  # re-evaluated: the same number
