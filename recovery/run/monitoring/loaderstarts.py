"""DataLoader iterators started while a run is watched, shown to the run's watch.

Every ``DataLoader`` iterator draws its workers' base seed when it starts, from the
loader's ``generator=`` or, without one, from the global torch generator that the
training step's dropout and noise draw from too. A test pass that starts such a
loader after a checkpoint was taken, and before the next optimizer step (the
natural place of an epoch's test pass: after the epoch's loop, after its last
``maybe_save``), moves the global stream in code a run resumed from that checkpoint
does not run again: from there the resumed run trains other random numbers.
Only the watch can tell when that window is open
(:meth:`recovery.run.monitoring.watch.Watch.saved` until the next optimizer step), so this
module only reports each start to the callbacks registered here.

How: ``DataLoader.__iter__`` is wrapped while at least one callback is registered,
and put back when the last one goes (torch offers no hook for an iterator's start).
A persistent-workers loader whose iterator already exists draws nothing again and
is not reported. Rejected: comparing the global generator's state at the next
optimizer step, which the next step's own forward pass (dropout) has moved
legitimately by then.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader

Callback = Callable[[DataLoader[Any]], None]

_callbacks: list[Callback] = []
_original: Callable[[DataLoader[Any]], Iterator[Any]] | None = None
_lock = threading.Lock()


def _iter(loader: DataLoader[Any]) -> Iterator[Any]:
    assert _original is not None
    fresh = not (loader.persistent_workers and getattr(loader, "_iterator", None) is not None)
    if fresh:
        for callback in list(_callbacks):
            callback(loader)
    return _original(loader)


def watch(callback: Callback) -> None:
    """Call ``callback(loader)`` each time a ``DataLoader`` iterator starts, from now on."""
    global _original
    with _lock:
        if _original is None:
            _original = DataLoader.__iter__
            DataLoader.__iter__ = _iter  # type: ignore[assignment,method-assign]
        _callbacks.append(callback)


def unwatch(callback: Callback) -> None:
    """Stop calling ``callback``; the last one gone, ``DataLoader`` is as torch made it."""
    global _original
    with _lock:
        _callbacks[:] = [
            c for c in _callbacks if c != callback
        ]  # bound methods: equal, not identical
        if not _callbacks and _original is not None:
            DataLoader.__iter__ = _original  # type: ignore[assignment,method-assign]
            _original = None
