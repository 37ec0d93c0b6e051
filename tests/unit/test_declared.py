"""Declared absences: a loop without a scheduler or a data position says so, and why."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from recovery.config import CheckpointConfig
from recovery.errors import ConfigError, IncompatibleStateError, PurposeError
from recovery.format.layout import METRICS_FILE, step_dir_name
from recovery.provenance import purpose
from recovery.provenance.purpose import BUILTIN
from recovery.run.checkpointer import Checkpointer
from recovery.run.restoring import choose
from recovery.state import declared
from recovery.state.registry import TrainState
from tests.conftest import resign

CONTINUATION = BUILTIN["continuation"].requires
STATE = ["model", "optimizer", "rng", "config", "provenance"]
WHY = {"scheduler": "lr is a function of the step", "sampler": "batches drawn from the rng"}


@pytest.mark.parametrize(
    ("present", "absent", "unmet", "errors"),
    [
        (CONTINUATION, {}, [], []),
        (STATE, WHY, [], []),
        (STATE, {}, ["scheduler", "sampler"], []),
        (STATE, {"scheduler": "x"}, ["sampler"], []),
        ([*STATE, "scheduler"], {"sampler": "x"}, [], []),
        # a declaration cannot stand in for what an exact resume cannot do without
        (
            [s for s in STATE if s != "model"] + ["scheduler", "sampler"],
            {"model": "x"},
            ["model"],
            ["'model' cannot be declared absent"],
        ),
        # a hand-written update: the optimizer declared absent
        (
            [s for s in STATE if s != "optimizer"] + ["scheduler", "sampler"],
            {"optimizer": "p -= lr * p.grad"},
            [],
            [],
        ),
        # a declaration the contract does not ask for, one that is also present, no reason
        (CONTINUATION, {"scaler": "x"}, [], ["'scaler' cannot be declared absent"]),
        ([*STATE, "sampler"], {"scheduler": "x", "sampler": "y"}, [], ["both registered"]),
        (STATE, {"scheduler": "", "sampler": "y"}, [], ["needs a reason"]),
        (STATE, ["scheduler"], ["scheduler", "sampler"], ["not a mapping"]),
    ],
)
def test_the_contract_accepts_a_declared_absence_and_nothing_else(present, absent, unmet, errors):
    assert purpose.unmet(CONTINUATION, present, absent) == unmet
    found = purpose.declaration_errors(CONTINUATION, present, absent)
    assert len(found) == len(errors) and all(
        e in line for e, line in zip(errors, found, strict=True)
    )


def test_a_declaration_the_purpose_does_not_require_is_refused():
    (line,) = purpose.declaration_errors(["model"], ["model"], {"scheduler": "x"})
    assert "does not require it" in line


@pytest.mark.parametrize(
    ("saved_absent", "saved", "live_absent", "live", "expected"),
    [
        ({}, ["model", "scheduler"], {}, ["model", "scheduler"], []),
        ({"scheduler": "f(step)"}, ["model"], {"scheduler": "other words"}, ["model"], []),
        ({"scheduler": "f(step)"}, ["model"], {}, ["model", "scheduler"], ["declares no"]),
        ({}, ["model", "scheduler"], {"scheduler": "f(step)"}, ["model"], ["holds 'scheduler'"]),
        (
            {"scheduler": "a"},
            ["model", "sampler"],
            {"sampler": "b"},
            ["model", "scheduler"],
            ["declares no 'scheduler'", "holds 'sampler'"],
        ),
    ],
)
def test_a_resume_must_find_the_same_declarations(saved_absent, saved, live_absent, live, expected):
    lines = declared.mismatches(saved_absent, saved, live_absent, live)
    assert len(lines) == len(expected)
    assert all(e in line for e, line in zip(expected, lines, strict=True))


@pytest.mark.parametrize(
    ("absent", "registered", "match"),
    [
        ({"rng": "x"}, [], "always captured"),
        ({"scheduler": "x"}, ["scheduler"], "registered and declared absent"),
        ({"scheduler": "  "}, [], "needs a reason"),
        ({"scheduler": None}, [], "needs a reason"),
        ({"": "x"}, [], "not a component name"),
    ],
)
def test_the_state_refuses_a_declaration_that_makes_no_sense(absent, registered, match):
    with pytest.raises(ConfigError, match=match):
        declared.validate(absent, registered)


# -- a nanoGPT-style loop: lr = f(step), batches from the global RNG ----------------------

DATA = torch.randn(64, 4)
TOTAL = 8


def lr_at(step: int) -> float:
    return 0.05 * (1 + step) / TOTAL


def nano(*, absent=WHY, scheduler=False):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=lr_at(0))
    extra = {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 3)} if scheduler else {}
    return TrainState(model=model, optimizer=opt, absent=absent, **extra)


def train(state: TrainState, ckpt: Checkpointer, step: int, until: int) -> dict[int, float]:
    model, opt = state.components["model"], state.components["optimizer"]
    losses = {}
    while step < until:
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        ids = torch.randint(0, len(DATA), (8,))  # the batch comes from the captured RNG
        loss = model(DATA[ids]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        losses[step] = loss.item()
        ckpt.record(step, loss=losses[step])
        ckpt.maybe_save(state, step)
    return losses


def checkpointer(path, signer, trust, prov, **kw) -> Checkpointer:
    return Checkpointer(
        CheckpointConfig(every_steps=4),
        path,
        final_step=TOTAL,
        signer=signer,
        trust=trust,
        provenance=prov,
        preemption=False,
        **kw,
    )


def test_a_loop_without_scheduler_or_sampler_declares_so_and_resumes_exactly(
    tmp_path, signer, trust, prov, caplog
):
    ref_state = nano()
    with checkpointer(tmp_path / "ref", signer, trust, prov) as ck:
        ref = train(ref_state, ck, ck.restore(ref_state, "latest"), TOTAL)

    state = nano()
    with checkpointer(tmp_path / "run", signer, trust, prov) as ck:
        head = train(state, ck, ck.restore(state, "latest"), 4)
    loaded = choose.load(tmp_path / "run" / step_dir_name(4), trust)
    assert loaded.manifest.recovery["absent"] == WHY  # recorded in the signed statement
    assert loaded.manifest.recovery["requires"] == CONTINUATION
    assert "scheduler" not in loaded.components and "sampler" not in loaded.components

    state = nano()
    caplog.set_level(logging.INFO)
    with checkpointer(tmp_path / "run", signer, trust, prov) as ck:
        step = ck.restore(state, "latest")
        tail = train(state, ck, step, TOTAL)
    assert step == 4 and {**head, **tail} == ref
    assert (
        "restored model, optimizer, health, rng; declared absent: "
        "sampler (batches drawn from the rng), scheduler (lr is a function of the step)"
    ) in caplog.text
    records = [json.loads(x) for x in (tmp_path / "run" / METRICS_FILE).read_text().splitlines()]
    (event,) = [r for r in records if r.get("event") == "resume"]
    assert event["restored"] == ["model", "optimizer", "health", "rng"]
    assert event["absent"] == WHY
    (start,) = [r for r in records if r.get("event") == "start"]
    assert start["absent"] == WHY


def test_an_undeclared_absence_is_refused_before_anything_is_touched(tmp_path, signer, trust, prov):
    state = nano(absent={"sampler": "batches drawn from the rng"})
    ck = checkpointer(tmp_path / "run", signer, trust, prov)
    with pytest.raises(PurposeError, match=r"\['scheduler'\]") as err:
        ck.restore(state, "latest")
    assert "absent={'scheduler': 'the lr is a function of the step'}" in str(err.value)
    assert err.value.missing == ["scheduler"]
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="'model' cannot be declared absent"):
        opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
        ck.restore(TrainState(optimizer=opt, absent={"model": "x"}), None)


@pytest.mark.parametrize("saved_with_scheduler", [False, True])
def test_resuming_across_a_declaration_and_the_real_component_is_a_mismatch(
    tmp_path, signer, trust, prov, saved_with_scheduler
):
    def build(with_scheduler: bool) -> TrainState:
        absent = {"sampler": WHY["sampler"]}
        if not with_scheduler:
            absent["scheduler"] = WHY["scheduler"]
        return nano(absent=absent, scheduler=with_scheduler)

    state = build(saved_with_scheduler)
    with checkpointer(tmp_path / "run", signer, trust, prov) as ck:
        train(state, ck, ck.restore(state, None), 4)
    other = build(not saved_with_scheduler)
    ck = checkpointer(tmp_path / "run", signer, trust, prov)
    with pytest.raises(IncompatibleStateError) as err:
        ck.restore(other, "latest")
    (line,) = err.value.mismatches
    expected = "holds 'scheduler'" if saved_with_scheduler else "declares no 'scheduler'"
    assert expected in line
    ck.close()


def test_the_signed_declaration_is_what_the_contract_checks(tmp_path, signer, trust, prov):
    state = nano()
    with checkpointer(tmp_path / "run", signer, trust, prov) as ck:
        train(state, ck, ck.restore(state, None), 4)
    path = tmp_path / "run" / step_dir_name(4)

    resign(path, signer, lambda st: st["predicate"]["recovery"].pop("absent"))
    with pytest.raises(PurposeError, match="lacks \\['scheduler', 'sampler'\\]"):
        choose.load(path, trust)
    resign(path, signer, lambda st: st["predicate"]["recovery"].update(absent={"model": "x"}))
    with pytest.raises(PurposeError, match="'model' cannot be declared absent"):
        choose.load(path, trust)


def test_inspect_shows_the_declared_absences(tmp_path, signer, trust, prov, capsys):
    from recovery import cli

    state = nano()
    with checkpointer(tmp_path / "run", signer, trust, prov) as ck:
        train(state, ck, ck.restore(state, "latest"), 4)
    path = tmp_path / "run" / step_dir_name(4)
    args = ["inspect", str(path), "--allow-untrusted"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "absent      scheduler: lr is a function of the step" in out
    assert cli.main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["absent"] == WHY
