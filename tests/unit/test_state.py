import pytest
import torch

from recovery.errors import ConfigError, IncompatibleStateError
from recovery.state import rng
from recovery.state.registry import TrainState
from recovery.state.sampler import ResumableSampler
from tests.conftest import tensor_bytes, tensors_from, tiny_state, train_steps


def snapshot_values(state):
    model = state.components["model"]
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_restore_continues_identically():
    a = tiny_state()
    train_steps(a, 2)
    tree = a.state_dict()
    import copy

    saved = copy.deepcopy(tree)
    ref = train_steps(a, 4)
    b = tiny_state()
    with torch.no_grad():
        for p in b.components["model"].parameters():
            p.add_(1.0)
    b.load_state_dict(saved)
    assert train_steps(b, 4) == ref


def test_mismatched_model_lists_every_mismatch_and_loads_nothing():
    src = tiny_state(width=4)
    train_steps(src, 1)  # so Adam holds moments
    dst = tiny_state(width=6)
    train_steps(dst, 1)
    before = snapshot_values(dst)
    sampler_before = dst.components["sampler"].state_dict()
    rng_before = rng.capture()
    with pytest.raises(IncompatibleStateError) as err:
        dst.load_state_dict(src.state_dict(), source="ckpt-dir")
    lines = err.value.mismatches
    assert "0.weight: checkpoint shape (4, 3), model shape (6, 3)" in lines
    assert "0.bias: checkpoint shape (4,), model shape (6,)" in lines
    assert "2.weight: checkpoint shape (1, 4), model shape (1, 6)" in lines
    assert any(line.startswith("optimizer state") for line in lines)
    assert "ckpt-dir" in str(err.value)
    after = snapshot_values(dst)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert dst.components["sampler"].state_dict() == sampler_before
    assert torch.equal(rng.capture()["torch"], rng_before["torch"])


def test_missing_and_unexpected_keys_and_components():
    src = tiny_state().state_dict()
    src["model"]["extra.weight"] = torch.zeros(1)
    del src["model"]["0.bias"]
    del src["sampler"]
    src["scaler"] = {}
    problems = tiny_state().mismatches(src)
    assert "missing in checkpoint: 0.bias (4,)" in problems
    assert "not in this model: extra.weight" in problems
    assert "component 'sampler' is not in the checkpoint" in problems
    assert "checkpoint has component 'scaler', which this run does not register" in problems


def test_sampler_cursor_mismatch_is_found_before_anything_loads():
    src = tiny_state()
    train_steps(src, 2)
    tree = src.state_dict()
    tree["sampler"]["seed"] = 123
    dst = tiny_state()
    before = snapshot_values(dst)
    with pytest.raises(IncompatibleStateError, match="sampler.seed"):
        dst.load_state_dict(tree)
    after = snapshot_values(dst)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_dtype_mismatch():
    src = tiny_state().state_dict()
    src["model"]["0.weight"] = src["model"]["0.weight"].double()
    assert (
        "0.weight: checkpoint dtype torch.float64, model dtype torch.float32"
        in tiny_state().mismatches(src)
    )


def test_user_stateful_is_saved_and_restored():
    class Counter:
        def __init__(self):
            self.n = 0

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, s):
            self.n = s["n"]

    c = Counter()
    c.n = 7
    state = TrainState(counter=c)
    tree = state.state_dict()
    d = Counter()
    TrainState(counter=d).load_state_dict(tree)
    assert d.n == 7


def test_bad_components():
    with pytest.raises(ConfigError, match="reserved"):
        TrainState(rng=object())
    with pytest.raises(ConfigError, match="state_dict"):
        TrainState(thing=object())


def test_grad_scaler_state_roundtrips_through_the_format():
    from recovery.format import codec

    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
    scaler.update(new_scale=256.0)
    skeleton, tensors = codec.split(TrainState(scaler=scaler).state_dict())
    tree = codec.join(
        codec.loads_json(codec.dumps_json(skeleton), name="s"),
        tensors_from(tensor_bytes(tensors)),
    )
    fresh = torch.amp.GradScaler("cpu")
    TrainState(scaler=fresh).load_state_dict(tree)
    assert fresh.get_scale() == 256.0 and fresh.get_growth_interval() == 7


def test_add_registers_one_more_component_and_refuses_duplicates_and_non_stateful():
    state = TrainState(model=torch.nn.Linear(2, 2))
    sampler = ResumableSampler(10, 2, 0)
    state.add("sampler", sampler)
    assert state.names == ["model", "sampler", "rng"]
    with pytest.raises(ConfigError, match="already registered"):
        state.add("sampler", sampler)
    with pytest.raises(ConfigError, match="already registered"):
        state.add("rng", sampler)
    with pytest.raises(ConfigError, match="state_dict"):
        state.add("other", object())


def test_the_health_history_is_optional_in_both_directions():
    from recovery.config import HealthConfig
    from recovery.state.health import HealthMonitor

    plain = tiny_state()
    tree = plain.state_dict()
    watched = tiny_state()
    watched.add("health", HealthMonitor(HealthConfig()))
    assert watched.mismatches(tree) == []  # a checkpoint from before the monitor
    watched.load_state_dict(tree)
    tree_with = watched.state_dict()
    assert "health" in tree_with
    assert plain.mismatches(tree_with) == []  # a run with health.enabled=false
    plain.load_state_dict(tree_with)


def test_components_are_handed_tensors_that_own_their_memory():
    from recovery.state.registry import TrainState

    class Keeper:
        """Keeps what it is handed, as a torchdata StatefulDataLoader does."""

        def __init__(self):
            self.kept = None

        def state_dict(self):
            return {"gen": torch.arange(8, dtype=torch.uint8), "nested": [torch.ones(2)]}

        def load_state_dict(self, state):
            self.kept = state

    buffer = torch.arange(16, dtype=torch.uint8)
    view = buffer[4:12]  # a view into one file buffer, as zero-copy decoding gives
    state = TrainState(keeper=Keeper())
    tree = state.state_dict()
    tree["keeper"] = {"gen": view, "nested": [buffer[:8].view(torch.float32)]}
    state.load_state_dict(tree)
    kept = state.components["keeper"].kept
    assert torch.equal(kept["gen"], view) and kept["gen"].untyped_storage().data_ptr() != (
        buffer.untyped_storage().data_ptr()
    )
    assert kept["nested"][0].untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
    buffer.zero_()  # the file buffer reused or freed: what the component kept is unchanged
    assert kept["gen"].tolist() == list(range(4, 12))
