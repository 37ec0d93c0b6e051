"""Capture and restore every random stream a training step can draw from.

Streams: Python's ``random``, numpy's legacy global generator, torch's CPU
generator and, when CUDA is initialised, every CUDA device's generator. The
captured tree holds only tensors, ints, floats and numpy arrays, so it goes
through :mod:`recovery.format.codec` without pickle.

Rejected: capturing only torch's generator. Dropout draws from torch, but user
code, augmentation and samplers often draw from ``random`` or numpy, and one
missed stream is a different run.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from recovery.errors import IncompatibleStateError

PYTHON = "python"
NUMPY = "numpy"
TORCH = "torch"
CUDA = "cuda"


def capture() -> dict[str, Any]:
    """Return the state of every random stream, at this instant."""
    version, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)  # legacy=False always returns the dict form
    state: dict[str, Any] = {
        PYTHON: {"version": version, "internal": list(internal), "gauss": gauss},
        NUMPY: {
            "bit_generator": np_state["bit_generator"],
            "key": np.asarray(np_state["state"]["key"], dtype=np.uint32),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        TORCH: torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state[CUDA] = list(torch.cuda.get_rng_state_all())
    return state


def restore(state: dict[str, Any]) -> None:
    """Restore every stream captured by :func:`capture`.

    Raises:
        IncompatibleStateError: CUDA states were saved for a different number of devices.
    """
    py = state[PYTHON]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss"]))
    npst = state[NUMPY]
    np.random.set_state(
        {
            "bit_generator": npst["bit_generator"],
            "state": {"key": np.asarray(npst["key"], dtype=np.uint32), "pos": npst["pos"]},
            "has_gauss": npst["has_gauss"],
            "gauss": npst["gauss"],
        }
    )
    # set_rng_state reads the tensor's storage from its start: give it its own storage
    # (a loaded state may be a view into a larger file buffer)
    torch.set_rng_state(state[TORCH].clone())
    saved_cuda = state.get(CUDA)
    if saved_cuda is not None and torch.cuda.is_available():
        if len(saved_cuda) != torch.cuda.device_count():
            raise IncompatibleStateError(
                f"checkpoint holds CUDA RNG states for {len(saved_cuda)} devices, "
                f"this process sees {torch.cuda.device_count()}",
                mismatches=[
                    f"cuda devices: saved {len(saved_cuda)}, now {torch.cuda.device_count()}"
                ],
            )
        torch.cuda.set_rng_state_all([s.clone() for s in saved_cuda])


def validate(state: Any) -> list[str]:
    """Return what is wrong with a captured RNG tree, empty if it can be restored."""
    if not isinstance(state, dict):
        return [f"rng: expected a mapping, found {type(state).__name__}"]
    problems = [f"rng: missing stream '{k}'" for k in (PYTHON, NUMPY, TORCH) if k not in state]
    torch_state = state.get(TORCH)
    if torch_state is not None and not (
        isinstance(torch_state, torch.Tensor) and torch_state.dtype == torch.uint8
    ):
        problems.append("rng: torch stream is not a uint8 tensor")
    return problems
