"""A cheap fingerprint of the registered modules' parameters and buffers, in the per-step record.

Every ``K`` steps the per-step record carries ``parameters`` and ``buffers``: 16 hex
digits of a BLAKE2b digest over each registered ``nn.Module``'s tensors (name, dtype,
shape and bytes, in name order). The resume's self-check compares them at the redone
steps where the run that died recorded them (:class:`Fingerprints` computes them there
too, whatever its own ``K``). So a resume whose every loss matched but whose module
state did not is caught: work outside the optimizer step that a resumed loop runs at
other steps (a periodic forward pass in train mode moves BatchNorm's running
statistics; a batch counter that restarts at 0 after a resume) is ``INEXACT`` with
``buffers`` named.

``checkpoint.resume_check.fingerprint``: an integer ``K``, ``off``, or ``auto`` (the
default): the smallest power of two that keeps a fingerprint's cost, measured on the
run's first records, under :data:`BUDGET` of the steps between two of them
(:func:`every`); none past :data:`MOST` steps (a model too large for its steps to
pay it). The figures are in BENCHMARKS.md ("State fingerprints").
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterable
from typing import Any

import torch

from recovery.config.checkpoint import fingerprint_every
from recovery.state.registry import TrainState

PARAMETERS, BUFFERS = "parameters", "buffers"
FIELDS = (PARAMETERS, BUFFERS)
"""The per-step record's fingerprint fields."""
BUDGET = 0.01
"""``auto``: a fingerprint costs at most this share of the steps it covers."""
MOST = 1024
"""``auto``: no fingerprint when it would take more steps than this to pay for one."""


def every(cost_s: float, step_s: float, *, budget: float = BUDGET, most: int = MOST) -> int | None:
    """The smallest power of two ``K`` with ``cost_s <= budget * K * step_s``; ``None`` when
    that ``K`` is past ``most`` (or no step time was measured)."""
    if step_s <= 0 or not math.isfinite(step_s) or not math.isfinite(cost_s):
        return None
    need = cost_s / (budget * step_s)
    k = 1 if need <= 1 else 1 << math.ceil(math.log2(need))
    return k if k <= most else None


def modules(state: TrainState) -> list[tuple[str, torch.nn.Module]]:
    """The state's registered modules, by name."""
    return sorted((n, c) for n, c in state.components.items() if isinstance(c, torch.nn.Module))


def _bytes(t: torch.Tensor) -> Any:
    local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's shard
    local = local.detach()
    if local.device.type != "cpu":
        local = local.cpu()
    if not local.is_contiguous():
        local = local.contiguous()
    try:
        return local.numpy()  # its memory, no copy
    except TypeError:  # a dtype numpy lacks (bfloat16): its bytes as uint8
        flat = local.reshape(-1)
        return flat.view(torch.uint8).numpy() if flat.numel() else b""


def digest(tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """16 hex digits over each named tensor's name, dtype, shape and bytes, in order."""
    h = hashlib.blake2b(digest_size=8)
    for name, t in tensors:
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(_bytes(t))
    return h.hexdigest()


def fingerprint(mods: Iterable[tuple[str, torch.nn.Module]]) -> dict[str, str]:
    """``{"parameters": ..., "buffers": ...}`` of ``mods`` (``buffers`` only when any)."""
    mods = list(mods)
    params = [(f"{n}.{k}", p) for n, m in mods for k, p in m.named_parameters()]
    buffers = [(f"{n}.{k}", b) for n, m in mods for k, b in m.named_buffers()]
    return {PARAMETERS: digest(params), **({BUFFERS: digest(buffers)} if buffers else {})}


class Fingerprints:
    """Decides which per-step records carry the fingerprint, and computes it.

    Args:
        state: the run's state (its registered modules are fingerprinted).
        setting: ``checkpoint.resume_check.fingerprint`` (``auto``, ``off`` or ``K``).
        clock: seconds (``time.perf_counter``; a test's own).
    """

    def __init__(self, state: TrainState, setting: str, *, clock: Any = time.perf_counter) -> None:
        self.mods = modules(state)
        every_k = fingerprint_every(setting)
        self.off = every_k == 0 or not self.mods
        self.k: int | None = every_k if every_k else None
        """Every how many steps (``None``: not decided yet under ``auto``, or never)."""
        self.auto = every_k is None
        self._also: set[int] = set()
        self._clock = clock
        self._cost_s: float | None = None
        self._last: float | None = None

    def also(self, steps: Iterable[int]) -> None:
        """Fingerprint these steps too: the redone steps the run that died fingerprinted."""
        if not self.off:
            self._also.update(steps)

    def fields(self, step: int) -> dict[str, str]:
        """The fingerprint fields of the per-step record of ``step`` (none when not due)."""
        if self.off:
            return {}
        if self.auto:
            self._calibrate()
        due = (self.k is not None and step % self.k == 0) or step in self._also
        self._also.discard(step)
        return fingerprint(self.mods) if due else {}

    def _calibrate(self) -> None:
        """``auto``: at the first record, time one fingerprint; at the second, with the
        time the steps between them took, choose ``K`` (:func:`every`)."""
        now = self._clock()
        if self._cost_s is None:  # the faster of two: the first pays for warming up
            costs = []
            for _ in range(2):
                began = self._clock()
                fingerprint(self.mods)
                costs.append(self._clock() - began)
            self._cost_s = min(costs)
            self._last = self._clock()
            return
        self.k = every(self._cost_s, now - self._last if self._last is not None else 0.0)
        self.auto = False
