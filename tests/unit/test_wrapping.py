"""Compiled and DDP-wrapped models save under the unwrapped names and resume either way."""

import pytest
import torch

from recovery.errors import IncompatibleStateError
from recovery.state.wrapping import canonical, to_live
from tests.conftest import tiny_state


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (["a.weight", "b.bias"], ["a.weight", "b.bias"]),
        (["module.a.weight", "module.b.bias"], ["a.weight", "b.bias"]),
        (["_orig_mod.a.weight"], ["a.weight"]),
        (["module._orig_mod.a.weight", "module._orig_mod.b"], ["a.weight", "b"]),
        # a submodule named "module" beside others is a name, not a wrapper
        (["module.weight", "head.weight"], ["module.weight", "head.weight"]),
        ([], []),
    ],
)
def test_canonical(keys, expected):
    assert list(canonical(dict.fromkeys(keys))) == expected


def test_to_live_takes_the_live_models_names():
    saved = {"a.weight": 1, "b.bias": 2}
    assert to_live(saved, ["_orig_mod.a.weight", "_orig_mod.b.bias"]) == {
        "_orig_mod.a.weight": 1,
        "_orig_mod.b.bias": 2,
    }
    assert to_live({"module.a.weight": 1}, ["a.weight"]) == {"a.weight": 1}
    assert to_live({"x": 1}, ["a.weight"]) == {"x": 1}  # kept, for the mismatch check


class DDPLike(torch.nn.Module):
    """The key layout of DistributedDataParallel: the model under ``.module``."""

    def __init__(self, inner):
        super().__init__()
        self.module = inner


@pytest.mark.parametrize("wrap", [torch.compile, DDPLike], ids=["compiled", "ddp"])
def test_a_wrapped_run_and_a_plain_run_resume_from_each_other(wrap):
    plain = tiny_state(seed=0)
    wrapped = tiny_state(seed=1)
    wrapped.components["model"] = wrap(wrapped.components["model"])
    tree = wrapped.state_dict()
    assert all(not k.startswith(("module.", "_orig_mod.")) for k in tree["model"])
    plain.load_state_dict(tree, only=["model"])  # wrapped -> plain
    inner = wrapped.components["model"]
    inner = getattr(inner, "_orig_mod", getattr(inner, "module", inner))
    for a, b in zip(plain.components["model"].parameters(), inner.parameters(), strict=True):
        assert torch.equal(a, b)
    other = tiny_state(seed=2)
    other.components["model"] = wrap(other.components["model"])
    other.load_state_dict(tiny_state(seed=3).state_dict(), only=["model"])  # plain -> wrapped
    theirs = dict(tiny_state(seed=3).components["model"].named_parameters())
    for name, p in other.components["model"].named_parameters():
        assert torch.equal(p, theirs[canonical({name: 0}).popitem()[0]])


def test_a_model_that_does_not_fit_is_still_refused_with_its_names():
    state = tiny_state(width=4)
    tree = state.state_dict()
    wider = tiny_state(width=5)
    wider.components["model"] = torch.compile(wider.components["model"])
    with pytest.raises(IncompatibleStateError, match=r"_orig_mod\.0\.weight: checkpoint shape"):
        wider.load_state_dict(tree)


class Tied(torch.nn.Module):
    """nanoGPT's layout: the output projection is the token embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(11, 4)
        self.lm_head = torch.nn.Linear(4, 11, bias=False)
        self.lm_head.weight = self.wte.weight


def test_tied_weights_are_stored_once_and_come_back_tied(tmp_path):
    from safetensors import safe_open

    from recovery.config import CheckpointConfig
    from recovery.run.checkpointer import Checkpointer
    from recovery.state.registry import TrainState

    def state(seed):
        torch.manual_seed(seed)
        model = Tied()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, 1)
        return model, TrainState(model=model, optimizer=opt, scheduler=sched, sampler=Cursor())

    model, saved = state(0)
    ckpt = Checkpointer(CheckpointConfig(every_steps=1), tmp_path / "run", final_step=1)
    ckpt.restore(saved, None)
    path = ckpt.save(saved, 1, sync=True)
    ckpt.close()
    keys = []
    for f in path.rglob("*.safetensors"):
        with safe_open(f, "pt") as fh:
            keys += list(fh.keys())
    assert len([k for k in keys if k.endswith("weight")]) == 1, keys

    other, restored = state(1)
    ckpt = Checkpointer(CheckpointConfig(every_steps=1), tmp_path / "run", final_step=1)
    assert ckpt.restore(restored, "latest") == 1
    ckpt.close()
    assert other.lm_head.weight is other.wte.weight
    assert torch.equal(other.wte.weight, model.wte.weight)


class Cursor:
    """A stand-in data position (the continuation contract wants one)."""

    def state_dict(self):
        return {"offset": 0}

    def load_state_dict(self, state):
        pass
