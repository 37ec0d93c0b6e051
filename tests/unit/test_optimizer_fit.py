"""recovery.state.fit.optimizer_mismatches: an optimizer's saved state against what its
class writes (per parameter; L-BFGS flat over its group; Adafactor factored), table tests."""

from __future__ import annotations

import pytest
import torch

from recovery.state import fit


def trained(make, steps: int = 2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    opt = make(model.parameters())
    x, y = torch.randn(8, 3), torch.randn(8, 1)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
    return model, opt


MAKERS = {
    "lbfgs": lambda p: torch.optim.LBFGS(p, max_iter=3, history_size=4),
    "adafactor": lambda p: torch.optim.Adafactor(p),
    "adam": lambda p: torch.optim.Adam(p),
    "sgd-momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
}


@pytest.mark.parametrize("name", sorted(MAKERS))
def test_the_state_an_optimizer_writes_fits_the_optimizer_that_wrote_it(name):
    _, opt = trained(MAKERS[name])
    assert fit.optimizer_mismatches(opt.state_dict(), opt) == []
    _, fresh = trained(MAKERS[name], steps=0)  # a resumed process: no state yet
    assert fit.optimizer_mismatches(opt.state_dict(), fresh) == []


def test_another_models_state_is_refused_naming_the_layout():
    _, opt = trained(MAKERS["lbfgs"])
    smaller = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))  # 13 numbers
    other = torch.optim.LBFGS(smaller.parameters())
    problems = fit.optimizer_mismatches(opt.state_dict(), other)
    assert any(
        "optimizer state 0.d: shape (21,), expected (13,) (one flat vector over the group's "
        "parameters, as LBFGS keeps it)" in p
        for p in problems
    ), problems
    saved = trained(MAKERS["adam"])[1].state_dict()
    flat = {**saved, "state": {0: {**saved["state"][0], "exp_avg": torch.zeros(12)}}}
    problems = fit.optimizer_mismatches(flat, trained(MAKERS["adam"], steps=0)[1])
    assert problems == [
        "optimizer state 0.exp_avg: shape (12,), expected (4, 3) (the parameter's shape, as "
        "Adam keeps it) for a parameter of shape (4, 3)"
    ]


@pytest.mark.parametrize(
    ("layout", "param", "shape"),
    [
        (fit.PARAM, (4, 3), (4, 3)),
        (fit.FLAT_GROUP, (4, 3), (21,)),
        (fit.FLAT_PARAM, (4, 3), (12,)),
        (fit.ROW, (4, 3), (4, 1)),
        (fit.COLUMN, (4, 3), (1, 3)),
        (fit.ROW, (4,), None),
        (fit.COLUMN, (2, 4, 3), (2, 1, 3)),
    ],
)
def test_shape_of_each_layout(layout, param, shape):
    assert fit.shape_of(layout, param, 21) == shape


def test_an_optimizer_class_not_in_the_table_may_use_any_layout():
    class Flat(torch.optim.Optimizer):  # keeps one flat buffer, as ZeRO-style shards do
        def __init__(self, params):
            super().__init__(params, {})

    model = torch.nn.Linear(3, 4)
    opt = Flat(model.parameters())
    saved = {"state": {0: {"buf": torch.zeros(16)}}, "param_groups": [{"params": [0, 1]}]}
    assert fit.layouts(opt, "buf") == fit.ANY
    assert fit.optimizer_mismatches(saved, opt) == []
