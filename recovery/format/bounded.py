"""Parsing with bounds: nesting and size that no input can push past.

``json.loads`` of 200,000 nested ``[`` raises ``RecursionError`` (not a
``ValueError``), which escaped every ``except`` around a parse: ``verify``,
``audit`` and a requeued ``+resume=latest`` crashed on one crafted
``model.sig`` or ``state.json`` instead of refusing it and falling back. And a
tree that parses at depth 900 still overflows the recursive walks after it
(decoding, redaction, drift). So every parse here raises ``ValueError`` (the
callers already map that to their typed error) for anything nested past
:data:`MAX_DEPTH` or larger than its caller's limit. Rejected: a hand-written
depth pre-scan of the raw bytes (a second parser to keep right); the check
walks the parsed tree iteratively instead.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

MAX_DEPTH = 100
"""Deepest nesting of lists and mappings accepted; ours stay under 20."""


def check_depth(obj: Any, *, limit: int = MAX_DEPTH) -> None:
    """Refuse a tree of lists and mappings nested deeper than ``limit``.

    Raises:
        ValueError: naming the depth found.
    """
    stack = [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            if depth > limit:
                raise ValueError(f"nested more than {limit} levels deep")
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)


def check_size(data: bytes | str, *, limit: int) -> None:
    """Refuse more than ``limit`` bytes (or characters).

    Raises:
        ValueError: naming both sizes.
    """
    if len(data) > limit:
        raise ValueError(f"{len(data)} bytes, more than the {limit} accepted")


def json_loads(data: bytes | str, *, limit: int | None = None) -> Any:
    """``json.loads`` within :data:`MAX_DEPTH` (and ``limit`` bytes, if given).

    Raises:
        ValueError: not JSON (``JSONDecodeError``, ``UnicodeDecodeError``), too deep, too large.
    """
    if limit is not None:
        check_size(data, limit=limit)
    try:
        obj = json.loads(data)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep") from None
    if len(data) > 2 * MAX_DEPTH:  # shorter, it cannot open and close MAX_DEPTH + 1 levels
        check_depth(obj)
    return obj


def yaml_load(data: bytes | str) -> Any:
    """``yaml.safe_load`` within :data:`MAX_DEPTH`.

    Raises:
        ValueError: not YAML, or too deep.
    """
    try:
        obj = yaml.safe_load(data)
    except RecursionError:
        raise ValueError(f"nested more than {MAX_DEPTH} levels deep") from None
    except yaml.YAMLError as err:
        raise ValueError(f"not YAML ({err})") from None
    check_depth(obj)
    return obj
