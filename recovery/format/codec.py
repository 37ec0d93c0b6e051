"""Pickle-free state trees: tensors go to safetensors, everything else to JSON.

A state tree is what ``state_dict()`` methods return: nested dicts, lists and
tuples whose leaves are tensors, numpy arrays, ints, floats, strings, bools or
``None``. :func:`split` turns a tree into a JSON-able *skeleton* plus a flat
``{key: tensor}`` mapping; :func:`join` reverses it. Every Python type that
JSON would blur is tagged in the skeleton, so a round trip returns equal
objects of equal types:

- a tensor becomes ``{"__tensor__": key}``, key = the tree path joined by ``/``
  (a model's own parameter names stay readable: ``user.weight``); a tensor that
  is another one of the tree (the same memory, shape and strides: tied weights
  such as a language model's ``wte``/``lm_head``) is stored once, and both paths
  reference that key, so :func:`join` hands back one tensor for both;
- a tuple becomes ``{"__tuple__": [...]}`` (Adam's ``betas``);
- a dict with non-string keys becomes ``{"__dict__": [[k, v], ...]}``
  (optimizer state is keyed by int parameter ids);
- a float that JSON cannot spell (nan, inf) becomes ``{"__float__": "inf"}``;
  finite floats are written with ``repr``, which round-trips exactly;
- a numpy array becomes ``{"__ndarray__": {"dtype", "shape", "data"}}``
  (numpy's RNG key: 624 uint32 words, small enough for JSON).

Rejected: pickle (executes code on load) and ``torch.save`` (pickle inside).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from recovery.errors import FormatError
from recovery.format import bounded

_TAGS = ("__tensor__", "__tuple__", "__dict__", "__float__", "__ndarray__")


def _escape(part: str) -> str:
    # RFC 6901 escaping keeps keys that contain '/' unambiguous.
    return part.replace("~", "~0").replace("/", "~1")


def split(tree: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split a state tree into a JSON-able skeleton and its tensors.

    Args:
        tree: the state tree.

    Returns:
        ``(skeleton, tensors)``; ``tensors`` maps key -> detached CPU tensor.

    Raises:
        FormatError: a leaf has a type this codec cannot store without pickle.
    """
    tensors: dict[str, torch.Tensor] = {}
    stored: dict[tuple[Any, ...], str] = {}  # a tensor's memory and view -> the key it went to

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            alias = _view(node)
            if alias in stored:
                return {"__tensor__": stored[alias]}
            key = path or "_"
            tensors[key] = node.detach()
            if alias is not None:
                stored[alias] = key
            return {"__tensor__": key}
        if isinstance(node, np.ndarray):
            return {
                "__ndarray__": {
                    "dtype": str(node.dtype),
                    "shape": list(node.shape),
                    "data": node.reshape(-1).tolist(),
                }
            }
        if isinstance(node, bool) or node is None or isinstance(node, str):
            return node
        if isinstance(node, int | np.integer):
            return int(node)
        if isinstance(node, float | np.floating):
            value = float(node)
            return value if math.isfinite(value) else {"__float__": repr(value)}
        if isinstance(node, tuple):
            return {
                "__tuple__": [
                    walk(v, f"{path}/{i}" if path else str(i)) for i, v in enumerate(node)
                ]
            }
        if isinstance(node, list):
            return [walk(v, f"{path}/{i}" if path else str(i)) for i, v in enumerate(node)]
        if isinstance(node, Mapping):
            if all(isinstance(k, str) for k in node):
                if any(k in _TAGS for k in node):
                    raise FormatError(
                        f"state key collides with a codec tag at '{path}': {list(node)}"
                    )
                return {
                    k: walk(v, f"{path}/{_escape(k)}" if path else _escape(k))
                    for k, v in node.items()
                }
            items = []
            for k, v in node.items():
                if not isinstance(k, str | int) or isinstance(k, bool):
                    raise FormatError(
                        f"state dict key {k!r} at '{path}' is a {type(k).__name__}; "
                        "only str and int keys can be stored without pickle"
                    )
                sub = _escape(str(k))
                items.append([k, walk(v, f"{path}/{sub}" if path else sub)])
            return {"__dict__": items}
        raise FormatError(
            f"cannot store a {type(node).__name__} at '{path or '<root>'}' without pickle; "
            "make the state_dict return tensors, numbers, strings, lists or dicts"
        )

    return walk(tree, ""), tensors


def _view(t: torch.Tensor) -> tuple[Any, ...] | None:
    """What makes two tensors the same values: one memory viewed the same way (``None``:
    an empty tensor, which shares no values with anything)."""
    if t.numel() == 0 or t.layout != torch.strided:
        return None
    return (
        t.device,
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        t.dtype,
        tuple(t.shape),
        t.stride(),
    )


def join(skeleton: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    """Rebuild a state tree from :func:`split`'s output.

    Raises:
        FormatError: the skeleton references a tensor that is absent, or a tag is malformed.
    """

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(v) for v in node]
        if not isinstance(node, dict):
            return node
        if "__tensor__" in node:
            key = node["__tensor__"]
            if key not in tensors:
                raise FormatError(f"state references tensor '{key}', which the tensor file lacks")
            return tensors[key]
        if "__tuple__" in node:
            return tuple(walk(v) for v in node["__tuple__"])
        if "__dict__" in node:
            return {k: walk(v) for k, v in node["__dict__"]}
        if "__float__" in node:
            return float(node["__float__"])
        if "__ndarray__" in node:
            spec = node["__ndarray__"]
            return np.asarray(spec["data"], dtype=np.dtype(spec["dtype"])).reshape(spec["shape"])
        return {k: walk(v) for k, v in node.items()}

    return walk(skeleton)


def dumps_json(obj: Any) -> bytes:
    """Serialise a skeleton as canonical JSON bytes (sorted keys, strict floats)."""
    return json.dumps(obj, sort_keys=True, allow_nan=False, separators=(",", ":")).encode()


def loads_json(data: bytes, *, name: str) -> Any:
    """Parse JSON bytes, naming ``name`` in the error if they are not JSON."""
    try:
        return bounded.json_loads(data)
    except ValueError as err:
        raise FormatError(f"{name}: expected JSON, found undecodable bytes ({err})") from err
