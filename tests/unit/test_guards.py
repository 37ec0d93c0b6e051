"""Guards against silent divergence, and the checkpointer's defaults for an own loop."""

from __future__ import annotations

import json
import logging
import os
import signal

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler

from recovery.config import CheckpointConfig, HealthConfig
from recovery.errors import ConfigError
from recovery.format.layout import METRICS_FILE
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal
from recovery.run.scheduling.preemption import PreemptionGuard
from recovery.state import guards
from recovery.state.registry import TrainState
from recovery.state.sampler import ResumableSampler

DATA = list(range(12))


def parts(scheduler: bool = True):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2) if scheduler else None
    return model, opt, sched


def kinds(state: TrainState) -> list[tuple[str, str]]:
    return [(c.kind, c.component) for c in state.cautions]


def events(run_dir, name="warning") -> list[dict]:
    lines = (run_dir / METRICS_FILE).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r.get("event") == name]


@pytest.fixture
def make(tmp_path, signer, trust, prov):
    made: list[Checkpointer] = []

    def build(run="run", every=2, final=8, **kw) -> Checkpointer:
        kw.setdefault("preemption", False)
        ck = Checkpointer(
            CheckpointConfig(every_steps=every),
            tmp_path / run,
            final_step=final,
            signer=signer,
            trust=trust,
            provenance=prov,
            **kw,
        )
        made.append(ck)
        return ck

    yield build
    for ck in made:
        ck._restorer.release()


# -- at registration ---------------------------------------------------------------------


def test_a_plain_dataloader_or_sampler_is_refused_with_what_to_use_instead():
    model, opt, sched = parts()
    with pytest.raises(ConfigError, match=r"recovery\.ResumableLoader\(dataset, batch_size=") as e:
        TrainState(model=model, optimizer=opt, scheduler=sched, sampler=DataLoader(DATA))
    assert "StatefulDataLoader" in str(e.value)
    with pytest.raises(ConfigError, match=r"recovery\.ResumableSampler"):
        TrainState(model=model, optimizer=opt, scheduler=sched, sampler=RandomSampler(DATA))


def test_a_stateful_dataloader_without_a_generator_warns(caplog):
    from torchdata.stateful_dataloader import StatefulDataLoader

    model, opt, sched = parts()
    loader = StatefulDataLoader(DATA, batch_size=3, shuffle=True)
    state = TrainState(model=model, optimizer=opt, scheduler=sched, sampler=loader)
    assert kinds(state) == [(guards.LOADER_GENERATOR, "sampler")]
    assert "has no generator=" in caplog.text and "global torch RNG" in caplog.text
    seeded = StatefulDataLoader(DATA, batch_size=3, shuffle=True, generator=torch.Generator())
    assert TrainState(model=model, optimizer=opt, scheduler=sched, sampler=seeded).cautions == []
    # a RandomSampler of its own without a generator draws the order from the global RNG too
    own = StatefulDataLoader(
        DATA, batch_size=3, sampler=RandomSampler(DATA), generator=torch.Generator()
    )
    state = TrainState(model=model, optimizer=opt, scheduler=sched, sampler=own)
    assert kinds(state) == [(guards.LOADER_GENERATOR, "sampler")]


def test_a_scheduler_attached_but_not_registered_warns():
    model, opt, sched = parts()
    absent = {"scheduler": "lr is a function of the step"}
    state = TrainState(model=model, optimizer=opt, absent=absent)
    assert kinds(state) == [(guards.UNREGISTERED_SCHEDULER, "optimizer")]
    assert "lr is a function of the step" in state.cautions[0].message
    assert TrainState(model=model, optimizer=opt, scheduler=sched).cautions == []
    # one built after the state is found when the run starts (TrainState.review)
    model, opt, _ = parts(scheduler=False)
    later = TrainState(model=model, optimizer=opt, absent=absent)
    assert later.cautions == []
    torch.optim.lr_scheduler.StepLR(opt, 2)
    assert [c.kind for c in later.review()] == [guards.UNREGISTERED_SCHEDULER]


def test_a_scheduler_or_optimizer_of_something_else_warns():
    model, opt, sched = parts()
    _, other_opt, _ = parts(scheduler=False)
    other_sched = torch.optim.lr_scheduler.StepLR(other_opt, 2)
    state = TrainState(model=model, optimizer=opt, scheduler=other_sched, x=sched)
    assert (guards.FOREIGN_OPTIMIZER, "scheduler") in kinds(state)
    stray = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    state = TrainState(model=model, optimizer=stray, absent={"scheduler": "f(step)"})
    assert kinds(state) == [(guards.FOREIGN_OPTIMIZER, "optimizer")]


def test_a_second_model_registered_with_its_own_optimizer_is_no_foreign_optimizer():
    # dcgan's way: netG as the model with optimizerG, netD beside it with optimizerD
    net_g, net_d = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    opt_g = torch.optim.Adam(net_g.parameters())
    opt_d = torch.optim.Adam(net_d.parameters())
    absent = {"scheduler": "a constant learning rate"}
    state = TrainState(model=net_g, optimizer=opt_g, netD=net_d, optimizerD=opt_d, absent=absent)
    assert kinds(state) == []
    stray = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
    state = TrainState(model=net_g, optimizer=opt_g, netD=net_d, opt3=stray, absent=absent)
    assert kinds(state) == [(guards.FOREIGN_OPTIMIZER, "opt3")]


def test_a_generator_is_registered_as_its_stream():
    g = torch.Generator().manual_seed(3)
    state = TrainState(batch_rng=g)
    saved = state.state_dict()
    first = torch.randint(0, 100, (5,), generator=g)
    state.load_state_dict(saved)
    assert torch.equal(torch.randint(0, 100, (5,), generator=g), first)


def test_the_cautions_are_journaled_when_the_run_starts(make, tmp_path):
    from torchdata.stateful_dataloader import StatefulDataLoader

    model, opt, sched = parts()
    loader = StatefulDataLoader(DATA, batch_size=3, shuffle=True)
    state = TrainState(model=model, optimizer=opt, scheduler=sched, sampler=loader)
    make().restore(state, None)
    (event,) = events(tmp_path / "run")
    assert event["kind"] == guards.LOADER_GENERATOR and event["component"] == "sampler"


# -- while the run trains ----------------------------------------------------------------


def loop(state, ck, steps, *, epoch_len=3, after_save=(), scaler=None):
    """Steps of a plain loop; ``after_save`` names what is (wrongly) stepped after maybe_save."""
    model, opt = state.components["model"], state.components["optimizer"]
    sched = state.components["scheduler"]
    step = 0
    while step < steps:
        loss = model(torch.ones(1, 2)).pow(2).sum()
        opt.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
        else:
            loss.backward()
            opt.step()
        if scaler is not None and "scaler" not in after_save:
            scaler.update()
        epoch_end = (step + 1) % epoch_len == 0
        if "scheduler" not in after_save and epoch_end:
            sched.step()
        step += 1
        ck.record(step, loss=loss.item())
        ck.maybe_save(state, step)
        if "scheduler" in after_save and epoch_end:
            sched.step()  # the epoch-end step after the save: the checkpoint misses it
        if scaler is not None and "scaler" in after_save:
            scaler.update()


@pytest.mark.parametrize("wrong", [False, True])
def test_an_epoch_scheduler_stepped_after_the_save_warns_once(make, tmp_path, caplog, wrong):
    model, opt, sched = parts()
    state = TrainState(
        model=model, optimizer=opt, scheduler=sched, sampler=ResumableSampler(4, 2, 0)
    )
    ck = make(every=3, final=12)
    ck.restore(state, None)
    loop(state, ck, 12, after_save=("scheduler",) if wrong else ())
    ck.close()
    found = events(tmp_path / "run")
    if not wrong:
        assert found == [] and "changed after the checkpoint" not in caplog.text
        return
    (event,) = found  # saves at 3, 6, 9: warned once
    assert event["kind"] == guards.STEPPED_AFTER_SAVE and event["step"] == 3
    assert "last_epoch 0 -> 1" in event["message"]
    assert "Do that work before the step's maybe_save" in event["message"]
    assert "if loader.epoch_ended" in event["message"]
    assert caplog.text.count("changed after the checkpoint") == 1


def test_a_grad_scaler_updated_after_the_save_warns(make, tmp_path):
    model, opt, sched = parts()
    scaler = torch.amp.GradScaler("cpu", growth_interval=1)
    state = TrainState(
        model=model, optimizer=opt, scheduler=sched, scaler=scaler,
        sampler=ResumableSampler(4, 2, 0),
    )  # fmt: skip
    ck = make(every=2, final=6)
    ck.restore(state, None)
    loop(state, ck, 6, scaler=scaler, after_save=("scaler",))
    ck.close()
    assert [(e["kind"], e["component"]) for e in events(tmp_path / "run")] == [
        (guards.STEPPED_AFTER_SAVE, "scaler")
    ]


# -- the resume health monitor in an own loop ---------------------------------------------

SMALL = HealthConfig(fit=3, window=2, history=20)


def adam_state():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    return TrainState(
        model=model, optimizer=opt, scheduler=sched, sampler=ResumableSampler(8, 2, 0)
    )


def adam_loop(state, ck, step, until, *, via_journal=False):
    model, opt, sched = (state.components[k] for k in ("model", "optimizer", "scheduler"))
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
    while step < until:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        if via_journal:
            ck.journal.write({"step": step, "loss": loss.item()})
        else:
            ck.record(step, loss=loss.item())
        ck.maybe_save(state, step)


@pytest.mark.parametrize("via_journal", [False, True])
def test_an_own_loop_is_monitored_and_its_resume_judged(make, tmp_path, via_journal):
    state = adam_state()
    ck = make(every=20, final=40, health=SMALL)
    adam_loop(state, ck, ck.restore(state, None), 20, via_journal=via_journal)
    ck.close()
    steps = [json.loads(x) for x in (tmp_path / "run" / METRICS_FILE).read_text().splitlines()]
    steps = [r for r in steps if "event" not in r]
    assert len(steps) == 20 and all(r["update"] > 0 and r["lr"] == 0.01 for r in steps)

    state = adam_state()
    ck = make(every=20, final=40, health=SMALL)
    step = ck.restore(state, "latest")
    assert step == 20 and "health" in state.components
    adam_loop(state, ck, step, 30, via_journal=via_journal)
    ck.close()
    (verdict,) = events(tmp_path / "run", "resume_health")
    assert verdict["resumed_at"] == 20 and verdict["status"] == "ok", verdict
    assert set(verdict["signals"]) == {"loss", "update"}


def test_a_state_with_its_own_monitor_or_health_off_is_left_alone(make, tmp_path):
    state = adam_state()
    ck = make(run="off", health=False)
    ck.restore(state, None)
    assert "health" not in state.components
    ck.record(1, loss=1.0)
    ck.close()
    (record,) = [
        r for r in map(json.loads, (tmp_path / "off" / METRICS_FILE).open()) if "loss" in r
    ]
    assert record == {"step": 1, "loss": 1.0}


# -- defaults ----------------------------------------------------------------------------


def test_the_journal_defaults_to_the_run_directory(make, tmp_path):
    state = adam_state()
    ck = make(run="j")
    ck.restore(state, None)
    ck.record(1, loss=0.5)
    ck.close()
    assert [r.get("event") for r in map(json.loads, (tmp_path / "j" / METRICS_FILE).open())][
        :2
    ] == ["start", None]
    given = Journal(tmp_path / "elsewhere.jsonl")
    ck = make(run="k", journal=given)
    ck.restore(adam_state(), None)
    ck.close()
    assert given.path.exists() and not (tmp_path / "k" / METRICS_FILE).exists()


def test_preemption_signals_are_caught_by_default_and_exit_75(make, tmp_path):
    before = signal.getsignal(signal.SIGUSR1)
    state = adam_state()
    with pytest.raises(SystemExit) as stop, make(run="p", preemption=None, every=100) as ck:
        step = ck.restore(state, None)
        assert signal.getsignal(signal.SIGUSR1) != before  # installed by restore
        os.kill(os.getpid(), signal.SIGUSR1)
        adam_loop(state, ck, step, 5)
    assert stop.value.code == 75
    # uninstalled by close; for SAME_REQUEST_S a default handler's place holds a stand-in
    # that takes a late copy of the signal for the same request, then does what it does
    after = signal.getsignal(signal.SIGUSR1)
    assert after == before or getattr(after, "__func__", None) is PreemptionGuard._late
    (event,) = events(tmp_path / "p", "preempted")
    assert event["signal"] == "SIGUSR1" and event["step"] == 1


def test_preemption_false_catches_nothing(make):
    before = signal.getsignal(signal.SIGTERM)
    ck = make(run="q", preemption=False)
    ck.restore(adam_state(), None)
    assert signal.getsignal(signal.SIGTERM) == before and ck.preemption is None
    ck.close()


def test_a_loop_that_warns_is_logged(caplog):
    caplog.set_level(logging.WARNING)
    model, opt, _ = parts()
    TrainState(model=model, optimizer=opt, absent={"scheduler": "f(step)"})
    assert "not registered" in caplog.text


def test_an_own_loop_resume_that_lost_the_optimizer_state_departs(make, tmp_path, monkeypatch):
    from recovery.state.registry import DROP_ENV

    state = adam_state()
    ck = make(every=20, final=40, health=SMALL)
    adam_loop(state, ck, ck.restore(state, None), 20)
    ck.close()
    monkeypatch.setenv(DROP_ENV, "optimizer")  # a resume that silently restarts Adam
    state = adam_state()
    ck = make(every=20, final=40, health=SMALL)
    adam_loop(state, ck, ck.restore(state, "latest"), 30)
    ck.close()
    (verdict,) = events(tmp_path / "run", "resume_health")
    assert verdict["status"] == "warn" and "update" in verdict["departed"], verdict


@pytest.mark.parametrize("puts_it_back", [False, True])
def test_a_metrics_callable_that_leaves_the_model_in_eval_mode_warns(make, tmp_path, puts_it_back):
    state = adam_state()
    model = state.components["model"]

    def evaluate():
        model.eval()
        loss = float(model(torch.ones(1, 4)).sum())
        if puts_it_back:
            model.train()
        return {"val": loss}

    ck = make(every=2, final=6)
    step = ck.restore(state, None)
    while step < 6:
        step += 1
        ck.maybe_save(state, step, metrics=evaluate)
    ck.close()
    # (this loop takes no optimizer step at all: save_before_step is warned too, not judged here)
    found = [
        (e["kind"], e["step"]) for e in events(tmp_path / "run") if e["kind"] != "save_before_step"
    ]
    assert found == ([] if puts_it_back else [(guards.EVAL_MODE, 2)])
