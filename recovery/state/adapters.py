"""Stateful views of objects that hold state but do not speak ``state_dict``.

A loop that draws from a generator of its own (``torch.randint(...,
generator=g)`` for its batches, a noise generator) must restore that stream
too; :class:`GeneratorState` lets it register the generator itself
(``TrainState(..., batch_rng=g)``), so there is no adapter to write.
"""

from __future__ import annotations

from typing import Any

import torch


class GeneratorState:
    """A ``torch.Generator``'s stream as a component: its state tensor (and device)."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.generator.get_state(), "device": str(self.generator.device)}

    def check_state_dict(self, state: Any) -> list[str]:
        """Why ``state`` is not this generator's: another device, or not a generator state."""
        if not isinstance(state, dict) or not isinstance(state.get("state"), torch.Tensor):
            return ["generator: checkpoint entry is not a generator state"]
        if state.get("device") != str(self.generator.device):
            return [
                f"generator: saved on {state.get('device')}, this one is on {self.generator.device}"
            ]
        return []

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["state"])


def adapt(obj: Any) -> Any:
    """``obj`` as a component: a generator wrapped in :class:`GeneratorState`, else itself."""
    return GeneratorState(obj) if isinstance(obj, torch.Generator) else obj
