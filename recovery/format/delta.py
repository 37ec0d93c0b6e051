"""Differential tensors: a table's rows that differ from a base, and the base patched back.

A *table* is a tensor of at least ``min_bytes`` with rows (dim 0) of two or more
elements' worth: an embedding matrix, or its optimizer moments. A delta of a
component holds each table that pays as two tensors, the changed rows' indices
(int64, ascending) and their values, and every other tensor whole; ``state.json``
records which keys are patched (:func:`diff`'s second result), so the decoder
never guesses from names.

Rows are compared by their bits (each element viewed as an integer of its
size), not by value: a NaN equals itself, ``-0.0`` differs from ``0.0``, so
base + delta is the full tensor bit for bit.

Rejected: tracking the rows a sparse gradient touched. It needs a hook in the
user's backward pass, misses rows changed any other way (a manual edit, a
re-initialised row, a dense optimizer step), and still writes a touched row
that came back unchanged; comparing the bits needs nothing from the loop and is
exact by construction (its cost is measured in ``BENCHMARKS.md``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from recovery.errors import FormatError
from recovery.format import statedoc, tensorrefs

ROWS = statedoc.ROWS
VALUES = statedoc.VALUES
"""Prefixes of the stored keys of a patched table: its changed rows and their values."""

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
INDEX_BYTES = 8
"""Each changed row also stores its index (int64)."""


def is_table(t: torch.Tensor, min_bytes: int) -> bool:
    """Whether ``t`` is compared row by row (else it is written whole)."""
    return (
        t.dim() >= 1
        and t.shape[0] >= 2
        and t.numel() * t.element_size() >= min_bytes
        and t.element_size() in _BITS
        and not t.is_sparse
        and not t.is_complex()  # a conjugate view has no integer view of its bits
    )


def pays(changed: int, rows: int, row_bytes: int) -> bool:
    """Whether writing ``changed`` of ``rows`` rows (with their indices) is smaller than
    writing the table whole."""
    return changed * (row_bytes + INDEX_BYTES) < rows * row_bytes


def changed_rows(current: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """The indices (int64, ascending, on ``base``'s device) of the rows of ``current`` whose
    bits differ from ``base``'s (same shape and dtype; ``current`` is compared on
    ``base``'s device: the host, where the checkpointer keeps its copy)."""
    bits = _BITS[current.element_size()]
    now = current.detach().to(base.device).reshape(current.shape[0], -1).view(bits)
    then = base.detach().reshape(base.shape[0], -1).view(bits)
    return torch.ne(now, then).any(dim=1).nonzero().reshape(-1)


def diff(
    current: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor], min_bytes: int
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
    """One component's tensors as a delta against ``base``.

    Returns:
        The tensors to write (whole ones under their own keys, a patched table's rows
        and values under :data:`ROWS` / :data:`VALUES` + key) and, per patched key,
        ``{"changed": n, "rows": N}``. A tensor with no same-shaped, same-dtype table
        in ``base``, or whose changed rows do not pay, is written whole.
    """
    out: dict[str, torch.Tensor] = {}
    tables: dict[str, dict[str, Any]] = {}
    if any(k.startswith((ROWS, VALUES)) for k in current):  # a name of ours: keep it whole
        return dict(current), tables
    for key, t in current.items():
        old = base.get(key)
        if (
            old is None
            or not is_table(t, min_bytes)
            or old.shape != t.shape
            or old.dtype != t.dtype
        ):
            out[key] = t
            continue
        rows = changed_rows(t, old)
        row_bytes = t[0].numel() * t.element_size()
        if not pays(len(rows), t.shape[0], row_bytes):
            out[key] = t
            continue
        out[ROWS + key] = rows
        out[VALUES + key] = t.detach().index_select(0, rows.to(t.device))
        tables[key] = {"changed": len(rows), "rows": int(t.shape[0])}
    return out, tables


def patch(
    stored: Mapping[str, torch.Tensor],
    base: Mapping[str, torch.Tensor],
    tables: Mapping[str, Any],
    *,
    where: str,
) -> dict[str, torch.Tensor]:
    """A component's full tensors: ``stored`` (a delta's) with each patched table rebuilt
    from ``base`` (a new tensor; ``base`` is not modified).

    Raises:
        FormatError: naming ``where``, a patched table without its rows or values, without
            its base tensor, or whose rows are not ascending, unique and in range, or whose
            values do not fit the base's rows.
    """
    if not isinstance(tables, Mapping):
        raise FormatError(f"{where}: expected a mapping of patched tables, found {tables!r}")
    if not tables:
        return dict(stored)
    out = {k: v for k, v in stored.items() if not k.startswith((ROWS, VALUES))}
    for key in tables:
        rows, values, old = tensorrefs.table_parts(stored, base, key, where=where)
        _check(key, rows, values, old, where=where)
        full = old.clone()
        full[rows] = values
        out[key] = full
    tensorrefs.no_stray(stored, tables, where=where)
    return dict(sorted(out.items()))


def _check(
    key: str, rows: torch.Tensor, values: torch.Tensor, old: torch.Tensor, *, where: str
) -> None:
    """Refuse rows and values that do not patch ``old`` exactly (see :func:`patch`)."""
    problem = None
    if old.dim() < 1:
        problem = f"its base tensor has no rows (shape {list(old.shape)})"
    elif rows.dtype != torch.int64 or rows.dim() != 1:
        problem = f"rows must be a 1-D int64 tensor, found {rows.dtype} of shape {list(rows.shape)}"
    elif len(rows) and (int(rows[0]) < 0 or int(rows[-1]) >= old.shape[0]):
        problem = f"rows outside 0..{old.shape[0] - 1}"
    elif len(rows) > 1 and not bool((rows[1:] > rows[:-1]).all()):
        problem = "rows not ascending and unique"
    elif values.dtype != old.dtype or tuple(values.shape) != (len(rows), *old.shape[1:]):
        problem = (
            f"values of {values.dtype} {list(values.shape)}, expected {old.dtype} "
            f"{[len(rows), *old.shape[1:]]}"
        )
    if problem is not None:
        raise FormatError(f"{where}: patched table {key!r}: {problem}")
