"""Model state under the names of the unwrapped model.

``torch.compile`` prefixes every key of a module's state with ``_orig_mod.``
and ``DistributedDataParallel`` with ``module.``. A checkpoint stores the
names of the model inside the wrappers, so a compiled or DDP-wrapped run and a
plain one resume from each other's checkpoints, and a warm start or an export
reads the same names whichever wrote them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

WRAPPERS = ("_orig_mod.", "module.")
"""Prefixes a wrapper puts before *every* key (a prefix on only some keys is a submodule's
name, and is kept)."""


def canonical(state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` with the wrappers' prefixes removed, outermost first, as often as they wrap."""
    out = dict(state)
    while out:
        prefix = next((p for p in WRAPPERS if all(k.startswith(p) for k in out)), None)
        if prefix is None:
            break
        out = {k[len(prefix) :]: v for k, v in out.items()}
    return out


def to_live(saved: Mapping[str, Any], live_keys: Iterable[str]) -> dict[str, Any]:
    """``saved`` (canonical or not) under the live model's own key names.

    Keys that have no counterpart are kept as they are, for the mismatch check to name.
    """
    live = list(live_keys)
    names = dict(zip(canonical(dict.fromkeys(live)), live, strict=True))
    return {names.get(k, k): v for k, v in canonical(saved).items()}
