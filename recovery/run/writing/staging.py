"""Host buffers that hold a snapshot of the state while a background thread writes it.

An async save must not block training for longer than a memory copy, and the
snapshot must be the step boundary: updates the optimizer makes afterwards
must not leak into it. :class:`Staging` copies every tensor of the state tree
into a buffer allocated on the first save and reused by every later one (pages
freed and re-touched cost seconds per GiB on these machines; a copy into warm
buffers costs a fraction of that), and keeps the non-tensor skeleton, which
:func:`recovery.format.codec.split` already builds from fresh immutable values.

Buffers are pinned when CUDA is available, so device-to-host copies can be
asynchronous; on CPU-only builds pinning is not possible and not needed.

Under ``torchrun``, :meth:`Staging.stage_tree` copies the tensors DCP writes
(a nested state dict) keeping its structure, and gives each of FSDP2's
DTensors a host DTensor over the staged local shard with the same mesh,
placements, global shape and stride, so DCP plans and writes exactly the
layout the live state would have given it.

Only one snapshot may be in flight: the checkpointer waits for the previous
write before staging the next, so a buffer is never overwritten while read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from recovery.format import codec


@dataclass(frozen=True)
class Staged:
    """A snapshot: per component, its skeleton and its tensors (views of the buffers)."""

    skeletons: dict[str, Any]
    tensors: dict[str, dict[str, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for ts in self.tensors.values() for t in ts.values()
        )


class Staging:
    """Preallocated host buffers, reused across snapshots of the same state layout."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], torch.Tensor] = {}
        self.allocated_bytes = 0

    def _buffer(self, name: tuple[str, str], like: torch.Tensor) -> torch.Tensor:
        buf = self._buffers.get(name)
        if buf is None or buf.shape != like.shape or buf.dtype != like.dtype:
            pin = torch.cuda.is_available()
            buf = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=pin)
            if self._buffers.get(name) is not None:
                self.allocated_bytes -= (
                    self._buffers[name].numel() * self._buffers[name].element_size()
                )
            self._buffers[name] = buf
            self.allocated_bytes += buf.numel() * buf.element_size()
        return buf

    def stage_tree(self, tree: Any, prefix: str = "") -> Any:
        """``tree`` with every tensor replaced by its staged copy, structure kept.

        For DCP state dicts (``{"model": ..., "optimizer": ...}``): dicts, lists
        and tuples are rebuilt, other leaves (numbers, strings) kept as they are.
        A DTensor's local shard is staged and wrapped again (:func:`host_dtensor`).
        Call :func:`synchronize` once the whole snapshot is staged.
        """
        if isinstance(tree, dict):
            return {k: self.stage_tree(v, f"{prefix}/{k}") for k, v in tree.items()}
        if isinstance(tree, list | tuple):
            return type(tree)(self.stage_tree(v, f"{prefix}/{i}") for i, v in enumerate(tree))
        if not isinstance(tree, torch.Tensor):
            return tree
        local = tree.to_local() if _is_dtensor(tree) else tree  # type: ignore[attr-defined]
        buf = self._buffer(("", prefix), local)
        with torch.no_grad():
            buf.copy_(local, non_blocking=local.device.type == "cuda")
        return host_dtensor(buf, tree) if local is not tree else buf

    def stage(self, tree: dict[str, Any]) -> Staged:
        """Copy ``tree`` (component name -> state) into the buffers; return the snapshot."""
        skeletons: dict[str, Any] = {}
        tensors: dict[str, dict[str, torch.Tensor]] = {}
        for component, state in tree.items():
            skeleton, live = codec.split(state)
            skeletons[component] = skeleton
            staged: dict[str, torch.Tensor] = {}
            for key, t in live.items():
                buf = self._buffer((component, key), t)
                buf.copy_(t, non_blocking=t.device.type == "cuda")
                staged[key] = buf
            tensors[component] = staged
        synchronize()
        return Staged(skeletons, tensors)


def synchronize() -> None:
    """Wait for the device-to-host copies issued so far (none without CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()


def _is_dtensor(t: torch.Tensor) -> bool:
    # duck-typed: importing DTensor costs a second, which a run without it need not pay
    return callable(getattr(t, "to_local", None)) and hasattr(t, "placements")


def host_dtensor(local: torch.Tensor, like: Any) -> torch.Tensor:
    """A DTensor over the host tensor ``local`` with ``like``'s mesh, placements, shape, stride."""
    from torch.distributed.tensor import DTensor

    if like.device_mesh.device_type == local.device.type:
        return DTensor.from_local(
            local,
            like.device_mesh,
            like.placements,
            run_check=False,
            shape=like.shape,
            stride=like.stride(),
        )
    # from_local moves its tensor onto the mesh's device, which would undo the staging: keep
    # the live DTensor's spec over the host tensor, as torch's own async staging does (it
    # swaps the local tensor of a copy); untested here, where no GPU was available
    return DTensor(local, like._spec, requires_grad=False)  # type: ignore[no-untyped-call]
