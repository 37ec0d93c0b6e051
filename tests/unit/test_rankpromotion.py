"""What a promotion under torchrun writes of a decoded snapshot (issue 30, part 2): the
collective save's parts, rebuilt from the tree a rank's snapshot holds; a snapshot that
does not fit is refused by name (the promotion's forked two-rank runs are in
``test_replicas.py``)."""

from __future__ import annotations

import pytest
import torch

from recovery.errors import FormatError
from recovery.parallel import rankstate
from recovery.run.tiers.collective import parts_of, rewrap


def _tree() -> dict:
    weight, moment = torch.ones(2, 3), torch.zeros(2, 3)
    return {
        "model": {"layer.weight": weight},
        "optimizer": {
            "state": {"layer.weight": {"exp_avg": moment, "step": torch.tensor(4.0)}},
            "param_groups": [{"lr": 0.1, "params": ["layer.weight"]}],
        },
        "rng": {"torch": torch.arange(3)},
        "sampler": {"epoch": 1, "offset": 64},
    }


LIKE = {  # DDP's: no DTensor, every leaf kept as saved
    "model": {"layer.weight": None},
    "optimizer": {"state": {"layer.weight": {"exp_avg": None, "step": None}}},
}


@pytest.mark.parametrize("leader", [True, False])
def test_a_snapshot_gives_the_collective_saves_parts_and_rank_0_the_other_components(leader):
    tree = _tree()
    parts, (skeletons, tensors) = parts_of(tree, LIKE, leader=leader)
    assert parts.tensors["model"]["layer.weight"] is tree["model"]["layer.weight"]
    assert parts.tensors["optimizer"] == tree["optimizer"]["state"]
    assert parts.groups == {"param_groups": [{"lr": 0.1, "params": ["layer.weight"]}]}
    assert parts.own == {"rng": tree["rng"]}
    assert list(skeletons) == (["sampler"] if leader else [])
    assert not tensors.get("sampler")


@pytest.mark.parametrize(
    ("drop", "names"),
    [
        (("rng",), "rng"),
        (("model", "optimizer"), "model, optimizer"),
        (("optimizer", "state"), "the optimizer state"),
    ],
)
def test_a_snapshot_without_what_the_save_needs_is_refused_by_name(drop, names):
    tree = _tree()
    if drop == ("optimizer", "state"):
        del tree["optimizer"]["state"]
    else:
        for name in drop:
            del tree[name]
    with pytest.raises(FormatError, match=f"lacks {names}"):
        parts_of(tree, LIKE, leader=True)


@pytest.mark.parametrize(
    ("saved", "like", "where"),
    [
        ({"a": 1}, {"b": None}, "model"),
        ({"a": {"x": 1}}, {"a": {"y": None}}, "model/a"),
        ({"a": [1]}, {"a": [None, None]}, "model/a"),
        ({"a": 1}, {"a": {"x": None}}, "model/a"),
    ],
)
def test_a_tree_that_differs_from_this_ranks_state_is_refused_naming_where(saved, like, where):
    with pytest.raises(FormatError, match=f"^{where}: the snapshot's"):
        rewrap(saved, like, "model")


def test_a_stateless_optimizer_names_its_parameters_as_dcp_does_in_a_compiled_submodule():
    """Plain SGD has no state for DCP's API to give (it would step it once to make some):
    its param groups name the parameters the way DCP's model state dict does, wrapper
    segments (``torch.compile``'s ``_orig_mod``) left out wherever they are."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    model = torch.nn.Sequential(torch.compile(torch.nn.Linear(2, 2)), torch.nn.Linear(2, 1))
    view = rankstate.view(model, torch.optim.SGD(model.parameters(), lr=0.1))
    [group] = view["optimizer"]["param_groups"]
    assert group["params"] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert sorted(group["params"]) == sorted(get_model_state_dict(model)) == sorted(view["model"])
