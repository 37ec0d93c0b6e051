"""One rank's own part of a model and optimizer under torchrun, as a plain tree, and back.

A local-tier snapshot under ``torchrun`` (:mod:`recovery.run.tiers.peers`) holds what its
rank holds, keyed by parameter name: with DDP the replicated tensors, with FSDP2 each
DTensor's local shard: :func:`view` takes model and optimizer through DCP's state-dict
API (keys that name parameters; an optimizer without state is not handed to it, which
would step it once to make some) and :func:`local` keeps every DTensor's local tensor (a
view, not a copy). :func:`load` puts such a tree back into the
same ranks' shards: it reads the live state the same way, checks every key, shape and
dtype against it first, copies the saved shards into copies of the live DTensors, and
only then applies them (``set_state_dict``). It serves the same world and the same
sharding only: a snapshot is resumed by the rank that took it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from recovery.errors import IncompatibleStateError
from recovery.parallel import sharded
from recovery.state import wrapping

MODEL, OPTIMIZER = sharded.SHARDED


def local(tree: Any) -> Any:
    """``tree`` with every DTensor replaced by its local tensor (a view)."""
    from torch.distributed.tensor import DTensor

    return tree_map_only(DTensor, lambda t: t.to_local(), tree)


def view(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``{"model": ..., "optimizer": {"state": ..., "param_groups": ...}}``: ``model`` and
    ``optimizer`` as DCP's state-dict API gives them (the live tensors, keyed by parameter
    name; FSDP2's as DTensors), an optimizer without state without calling that API."""
    if not optimizer.state:  # DCP's API would step it once (lr 0) to make its state
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return {MODEL: get_model_state_dict(model), OPTIMIZER: _stateless(model, optimizer)}
    tensors, groups = sharded.state_of(model, optimizer)
    return {MODEL: tensors[MODEL], OPTIMIZER: {"state": tensors[OPTIMIZER], **groups}}


def _stateless(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """An optimizer without state (plain SGD) as DCP's API gives one: its param groups,
    each naming its parameters."""
    names = {id(p): _fqn(n) for n, p in wrapping.canonical(dict(model.named_parameters())).items()}
    groups = [
        {
            **{k: v for k, v in g.items() if k != "params"},
            "params": [names[id(p)] for p in g["params"]],
        }
        for g in optimizer.param_groups
    ]
    return {"state": {}, "param_groups": groups}


WRAPPED = frozenset({"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"})
"""Name segments of wrappers (``torch.compile``, activation checkpointing, FSDP1) that DCP's
state-dict API leaves out of a parameter's name wherever they are (not only in front)."""


def _fqn(name: str) -> str:
    """A parameter's name as DCP's state-dict API gives it: without wrapper segments."""
    return ".".join(part for part in name.split(".") if part not in WRAPPED)


def _leaves(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_leaves(value, f"{prefix}/{key}"))
        return out
    return {prefix: tree}


def load(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, saved: dict[str, Any], *, where: Path
) -> None:
    """Put a tree :func:`view` and :func:`local` took (decoded from a verified snapshot)
    back into ``model`` and ``optimizer``; nothing is changed unless all of it fits.

    Raises:
        IncompatibleStateError: a key, shape or dtype differs from this rank's shards.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.tensor import DTensor

    msd, osd = get_state_dict(model, optimizer)
    target = tree_map_only(
        torch.Tensor, lambda t: t.detach().clone(), {MODEL: msd, OPTIMIZER: osd["state"]}
    )
    opt = saved.get(OPTIMIZER)
    opt_saved: dict[str, Any] = opt if isinstance(opt, dict) else {}
    have = _leaves({MODEL: saved.get(MODEL), OPTIMIZER: opt_saved.get("state")})
    want = _leaves(target)
    problems = [f"{k}: missing" for k in sorted(want.keys() - have.keys())]
    problems += [f"{k}: not in this run" for k in sorted(have.keys() - want.keys())]
    for key in sorted(want.keys() & have.keys()):
        live, got = want[key], have[key]
        if not isinstance(live, torch.Tensor):
            if isinstance(got, torch.Tensor) or type(got) is not type(live):
                problems.append(
                    f"{key}: saved {type(got).__name__}, this run {type(live).__name__}"
                )
            continue
        mine = live.to_local() if isinstance(live, DTensor) else live
        if not isinstance(got, torch.Tensor) or (got.shape, got.dtype) != (
            mine.shape,
            mine.dtype,
        ):
            found = (tuple(got.shape), got.dtype) if isinstance(got, torch.Tensor) else type(got)
            problems.append(
                f"{key}: saved {found}, this rank holds {(tuple(mine.shape), mine.dtype)}"
            )
    groups = opt_saved.get("param_groups")
    names = [g.get("params") if isinstance(g, dict) else None for g in groups or []]
    live_groups: list[Any] = list(osd["param_groups"])
    if not isinstance(groups, list) or names != [g["params"] for g in live_groups]:
        problems.append("optimizer param groups differ (their parameters, by name)")
        groups = []
    if problems:
        raise IncompatibleStateError(
            f"{where}: this rank's shards do not fit the snapshot ({len(problems)} "
            "mismatches): " + "; ".join(problems[:5]) + ". Resume from the persistent tier "
            "(+resume=<step>) or with the model, optimizer and sharding that wrote it.",
            mismatches=problems,
            path=where,
        )
    with torch.no_grad():
        for key, live in want.items():
            if isinstance(live, torch.Tensor):
                (live.to_local() if isinstance(live, DTensor) else live).copy_(have[key])
    target = _fill(target, {MODEL: saved.get(MODEL), OPTIMIZER: opt_saved.get("state")})
    set_state_dict(
        model,
        optimizer,
        model_state_dict=target[MODEL],
        optim_state_dict={"state": target[OPTIMIZER], "param_groups": groups},
    )


def _fill(target: Any, saved: Any) -> Any:
    """``target`` (tensors already filled) with every non-tensor leaf taken from ``saved``
    (an optimizer's plain-number state: LBFGS's counters)."""
    if isinstance(target, dict):
        return {k: _fill(v, saved[k]) for k, v in target.items()}
    return target if isinstance(target, torch.Tensor) else saved
