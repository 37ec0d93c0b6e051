import math

import numpy as np
import pytest
import torch

from recovery.errors import FormatError
from recovery.format import codec
from tests.conftest import tensor_bytes, tensors_from


def roundtrip(tree):
    skeleton, tensors = codec.split(tree)
    data = tensor_bytes(tensors)
    doc = codec.loads_json(codec.dumps_json(skeleton), name="state.json")
    return codec.join(doc, tensors_from(data))


def test_roundtrip_keeps_types_and_exact_values():
    tree = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 2)}, 1: {}},
        "param_groups": [
            {"lr": 0.1 + 0.2, "betas": (0.9, 0.999), "params": [0, 1], "foreach": None}
        ],
        "floats": [1e-300, -0.0, math.pi, float("inf"), float("-inf")],
        "arr": np.arange(6, dtype=np.uint32).reshape(2, 3),
        "flag": True,
        "name": "x/y~z",
    }
    out = roundtrip(tree)
    assert set(out["state"]) == {0, 1}
    assert torch.equal(out["state"][0]["exp_avg"], tree["state"][0]["exp_avg"])
    assert out["param_groups"][0]["betas"] == (0.9, 0.999)
    assert out["param_groups"][0]["lr"] == 0.1 + 0.2
    assert out["floats"][:4] == tree["floats"][:4]
    assert math.copysign(1, out["floats"][1]) == -1
    assert out["floats"][4] == float("-inf")
    assert out["arr"].dtype == np.uint32 and (out["arr"] == tree["arr"]).all()
    assert out["flag"] is True and out["name"] == "x/y~z"


def test_nan_roundtrips():
    out = roundtrip({"x": float("nan")})
    assert math.isnan(out["x"])


def test_model_keys_stay_readable():
    _, tensors = codec.split({"user.weight": torch.zeros(2), "a/b": torch.zeros(1)})
    assert set(tensors) == {"user.weight", "a~1b"}


def test_shared_storage_is_stored():
    w = torch.randn(3, 3)
    out = roundtrip({"a": w, "b": w, "c": w[0]})
    assert torch.equal(out["a"], out["b"]) and torch.equal(out["c"], w[0])


@pytest.mark.parametrize("leaf", [object(), {1.5: 2}, b"bytes", {"__tensor__": 1}])
def test_unstorable_leaf_is_refused(leaf):
    with pytest.raises(FormatError):
        codec.split({"x": leaf})


def test_missing_tensor_reference():
    with pytest.raises(FormatError, match="lacks"):
        codec.join({"w": {"__tensor__": "w"}}, {})


def test_bad_json_names_file():
    with pytest.raises(FormatError, match="state.json"):
        codec.loads_json(b"\xff{", name="state.json")


def test_a_tensor_twice_in_a_tree_is_stored_once_and_joined_as_one():
    w = torch.randn(3, 2)
    tree = {
        "a": w,
        "b": w,
        "copy": w.clone(),
        "row": w[0],
        "e1": torch.empty(0),
        "e2": torch.empty(0),
    }
    skeleton, tensors = codec.split(tree)
    assert sorted(tensors) == ["a", "copy", "e1", "e2", "row"]
    back = codec.join(skeleton, tensors)
    assert back["a"] is back["b"]
    assert back["e1"] is not back["e2"]
