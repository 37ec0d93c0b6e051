import random

import numpy as np
import pytest
import torch

from recovery.errors import IncompatibleStateError
from recovery.format import codec
from recovery.state import rng
from tests.conftest import tensor_bytes, tensors_from


def draw():
    return (
        random.random(),
        random.gauss(0, 1),
        float(np.random.rand()),
        float(np.random.randn()),
        torch.rand(3).tolist(),
    )


def test_capture_restore_every_stream_through_codec():
    random.gauss(0, 1)  # leave a cached gaussian in both generators
    np.random.randn()
    state = rng.capture()
    skeleton, tensors = codec.split(state)
    stored = codec.join(
        codec.loads_json(codec.dumps_json(skeleton), name="s"),
        tensors_from(tensor_bytes(tensors)),
    )
    first = draw()
    rng.restore(stored)
    assert draw() == first


def test_validate_reports_missing_streams():
    assert rng.validate({"python": {}}) == [
        "rng: missing stream 'numpy'",
        "rng: missing stream 'torch'",
    ]
    assert rng.validate([]) == ["rng: expected a mapping, found list"]
    assert rng.validate(rng.capture()) == []


def test_cuda_device_count_mismatch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    state = rng.capture()
    state["cuda"] = [torch.zeros(8, dtype=torch.uint8)]
    with pytest.raises(IncompatibleStateError, match="CUDA"):
        rng.restore(state)
