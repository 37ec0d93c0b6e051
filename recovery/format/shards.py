"""A large component's tensors in shard files of bounded size, the Hugging Face way.

A component whose tensors exceed the shard size is written as
``<component>-00001-of-0000N.safetensors`` ... plus
``<component>.safetensors.index.json`` (``{"metadata": {"total_size": ...},
"weight_map": {tensor: shard}}``), the layout ``transformers`` and
``safetensors`` tooling read. Why: the ``model_signing verify key`` CLI
verifies sha256 over whole files, and sha256 of one file runs on one core;
several files are written, read and hashed on every core at once. Every shard
and the index are listed and signed like any other file.

Shards are balanced (the component's bytes over ``ceil(total / shard size)``
files, tensors kept whole and in order), so no worker waits on one large
remainder; a single tensor larger than the shard size gets a shard of its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from recovery.errors import FormatError
from recovery.format import bounded
from recovery.format.layout import TENSOR_SUFFIX

if TYPE_CHECKING:  # only annotations: the index and shard names are read without torch
    import torch

INDEX_SUFFIX = f"{TENSOR_SUFFIX}.index.json"


def shard_name(component: str, index: int, count: int) -> str:
    """``model-00002-of-00004.safetensors`` (``index`` counts from 1)."""
    return f"{component}-{index:05d}-of-{count:05d}{TENSOR_SUFFIX}"


def index_name(component: str) -> str:
    """``model.safetensors.index.json``."""
    return f"{component}{INDEX_SUFFIX}"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def split(tensors: Mapping[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    """``tensors`` in balanced, ordered groups of about ``max_bytes`` or less each.

    ``max_bytes <= 0``, or tensors that fit in one shard, give one group.
    """
    total = sum(_nbytes(t) for t in tensors.values())
    if max_bytes <= 0 or total <= max_bytes:
        return [dict(tensors)]
    count = -(-total // max_bytes)
    target = total / count
    groups: list[dict[str, torch.Tensor]] = [{} for _ in range(count)]
    cursor = 0
    for key, t in tensors.items():
        size = _nbytes(t)
        # each tensor goes where its middle byte falls: balanced groups, order kept
        groups[min(count - 1, int((cursor + size / 2) // target))][key] = t
        cursor += size
    return [group for group in groups if group]


def files(
    component: str, tensors: Mapping[str, torch.Tensor], max_bytes: int
) -> dict[str, bytes | dict[str, torch.Tensor]]:
    """The files holding a component's tensors: one ``<component>.safetensors``, or its
    shards and their index when they exceed ``max_bytes``."""
    groups = split(tensors, max_bytes)
    if len(groups) == 1:
        return {f"{component}{TENSOR_SUFFIX}": groups[0]}
    out: dict[str, bytes | dict[str, torch.Tensor]] = {}
    weight_map: dict[str, str] = {}
    for i, group in enumerate(groups, 1):
        name = shard_name(component, i, len(groups))
        out[name] = group
        weight_map.update(dict.fromkeys(group, name))
    index = {
        "metadata": {"total_size": sum(_nbytes(t) for t in tensors.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    out[index_name(component)] = json.dumps(index, indent=2).encode()
    return out


def shard_names(component: str, index: bytes, *, where: str) -> dict[str, list[str]]:
    """Parse a component's index: shard file -> the tensor names it must hold.

    Raises:
        FormatError: naming ``where``, when the index is malformed, names a file that is
            not one of this component's shards, or its shards are not 1..N of N.
    """

    def bad(what: str) -> FormatError:
        return FormatError(
            f"{where}: expected a shard index ({{'weight_map': {{tensor: shard}}}}), found "
            f"{what}; the checkpoint was not written by this tool"
        )

    try:
        doc: Any = bounded.json_loads(index)
    except (UnicodeDecodeError, ValueError) as err:
        raise bad(f"unreadable JSON ({err})") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise bad("no weight_map")
    stem, suffix = re.escape(component), re.escape(TENSOR_SUFFIX)
    pattern = re.compile(rf"^{stem}-(\d{{5}})-of-(\d{{5}}){suffix}$")
    by_shard: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        if not isinstance(shard, str) or not pattern.match(shard):
            raise bad(f"tensor {key!r} in {shard!r}, not a shard of {component}")
        by_shard.setdefault(shard, []).append(key)
    counts = {int(m.group(2)) for m in map(pattern.match, by_shard) if m}
    numbers = sorted(int(m.group(1)) for m in map(pattern.match, by_shard) if m)
    if len(counts) != 1 or numbers != list(range(1, counts.pop() + 1)):
        raise bad(f"shards {sorted(by_shard)}, expected 00001..N of N, each holding a tensor")
    return by_shard
