"""The parts of a distributed checkpoint that are not one file per component.

- ``dcp/``: model and optimizer tensors, written collectively by
  ``torch.distributed.checkpoint`` (DCP). Each rank writes the shards it
  holds (replicated DDP tensors once, FSDP2 shards by their owners), so
  loading at another world size reshards them. Only tensors go in: the
  optimizer's param groups (learning rates, betas: plain numbers) travel in
  ``state.json``. DCP's ``.metadata`` is a pickle, which is why every
  ``dcp/`` file is listed in the signed manifest, and DCP reads only the
  verified bytes (:class:`recovery.integrity.reads.dcp.VerifiedReader`), never the
  directory.
- ``ranks/rank-NNNNN.{json,safetensors}``: state that differs per rank (its
  RNG streams), written by that rank through :mod:`recovery.format.codec`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._pytree import tree_map_only

from recovery.errors import FormatError, IncompatibleStateError, RecoveryError
from recovery.format import codec, tensorfile
from recovery.format.layout import DISTRIBUTED, RANK_DIR, TENSOR_SUFFIX
from recovery.format.manifest import FileRecord
from recovery.integrity.commits import commit

SHARDED = ("model", "optimizer")
"""Components that go through DCP in a distributed checkpoint."""
PER_RANK = ("rng",)
"""Components every rank saves for itself."""


# torch.distributed.checkpoint is imported where it is used: importing it costs about
# 1.5 s (it pulls in DTensor), which every process that never runs under torchrun
# (an own loop, `recovery verify`, each test's subprocess) would otherwise pay at start


def dcp_failure(err: BaseException) -> bool:
    """Whether ``err`` is a failure to report (any ``Exception``, or DCP's wrapper of the
    ranks' failures, a ``BaseException``), not an interrupt to let through."""
    if isinstance(err, Exception):
        return True
    from torch.distributed.checkpoint.api import CheckpointException

    return isinstance(err, CheckpointException)


def _alone() -> bool:
    """No process group: DCP reads and writes in this process only."""
    return not (dist.is_available() and dist.is_initialized())


def _quiet(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` without DCP's warning that it runs in one process (we know)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")
        return fn(*args, **kwargs)


def is_sharded(model: object) -> bool:
    """Whether ``model``'s parameters are sharded (FSDP2's DTensors)."""
    params = getattr(model, "parameters", None)
    return callable(params) and any(callable(getattr(p, "to_local", None)) for p in params())


def refuse_plain_into_sharded(model: object, where: Path) -> None:
    """A single-process checkpoint's full tensors cannot be copied into sharded parameters.

    Raises:
        IncompatibleStateError: naming what to do instead.
    """
    if is_sharded(model):
        raise IncompatibleStateError(
            f"{where}: was written by a single process (plain tensors); this run shards its "
            "model (dist.strategy=fsdp), which cannot load it yet. Resume it with "
            "dist.strategy=ddp, or in one process, and go on from that run's checkpoints.",
            mismatches=["single-process checkpoint into sharded parameters"],
            path=where,
        )


def rank_names(rank: int) -> tuple[str, str]:
    """The skeleton and tensor files of one rank's own state."""
    stem = f"{RANK_DIR}/rank-{rank:05d}"
    return f"{stem}.json", f"{stem}{TENSOR_SUFFIX}"


def write_rank(directory: Path, rank: int, tree: dict[str, Any]) -> list[FileRecord]:
    """Write this rank's own state (fsynced) into ``directory``; return the records."""
    skeleton, tensors = codec.split(tree)
    meta_name, tensor_name = rank_names(rank)
    (directory / RANK_DIR).mkdir(exist_ok=True)
    return [
        FileRecord(name, rec.digest, rec.size)  # hashed while written; named from the root
        for name, rec in (
            (tensor_name, commit.write_entry(directory / tensor_name, tensors)),
            (meta_name, commit.write_entry(directory / meta_name, codec.dumps_json(skeleton))),
        )
    ]


def read_rank(files: dict[str, Any], rank: int, *, where: Path) -> dict[str, Any]:
    """One rank's own state from a verified checkpoint's files.

    Raises:
        FormatError: that rank's files are absent or do not decode.
    """
    meta_name, tensor_name = rank_names(rank)
    raw, blob = files.get(meta_name), files.get(tensor_name)
    if not isinstance(raw, bytes) or not isinstance(blob, torch.Tensor):
        raise FormatError(
            f"{where}: holds no state for rank {rank} ({meta_name}, {tensor_name})",
            path=where,
        )
    skeleton = codec.loads_json(raw, name=str(where / meta_name))
    tree = codec.join(skeleton, tensorfile.views(blob, name=str(where / tensor_name)))
    if not isinstance(tree, dict):
        raise FormatError(f"{where / meta_name}: expected a mapping of components", path=where)
    return tree


def full_model(files: dict[str, Any], *, where: Path) -> dict[str, torch.Tensor]:
    """The whole model state in a verified checkpoint's ``dcp/`` bytes, as plain tensors.

    Reads in this process (no process group needed), at the shapes DCP
    recorded: what an export or a warm start needs from a distributed
    checkpoint, without building the sharded model.

    Args:
        files: the checkpoint's verified files; where: its directory (for messages).
    """
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from recovery.integrity.reads.dcp import VerifiedReader

    prefix = "model."
    try:
        saved = VerifiedReader(files, where=where).read_metadata().state_dict_metadata
        target = {
            fqn: torch.empty(meta.size, dtype=meta.properties.dtype)
            for fqn, meta in saved.items()
            if fqn.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
        }
        _read(target, files, where=where)
    except RecoveryError:
        raise
    except BaseException as err:
        if not dcp_failure(err):
            raise
        raise FormatError(
            f"{where}: its verified dcp/ files do not decode as a DCP checkpoint "
            f"({failure(err)}); resume from another checkpoint.",
            path=where,
        ) from err
    return {fqn[len(prefix) :]: t for fqn, t in target.items()}


def tree_with_model(
    tree: dict[str, Any], files: dict[str, Any], meta: dict[str, Any], *, where: Path
) -> dict[str, Any]:
    """``tree``, with the model's full weights from the verified ``dcp/`` bytes if that is
    where they are."""
    if "model" in tree or DISTRIBUTED not in meta:
        return tree
    return {**tree, "model": full_model(files, where=where)}


def _first(err: BaseException) -> tuple[int | None, BaseException]:
    """The first rank's own error inside DCP's wrapper (a ``BaseException``)."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, wrapped = sorted(failures.items())[0]
        return rank, wrapped[0] if isinstance(wrapped, tuple) else wrapped
    return None, err


def failure(err: BaseException) -> str:
    """The first rank's own error inside DCP's wrapper, in one line."""
    rank, inner = _first(err)
    where = f"rank {rank}: " if rank is not None else ""
    return f"{where}{type(inner).__name__}: {inner}"


def _read(target: dict[str, Any], files: dict[str, Any], *, where: Path) -> None:
    """DCP's load of ``target`` from the verified bytes; a refusal of ours comes out as itself.

    Raises:
        RecoveryError: the verified reader refused (a file DCP asked for was not verified).
        BaseException: DCP's own failure, :func:`dcp_failure` (the caller says what it means).
    """
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from recovery.integrity.reads.dcp import VerifiedReader

    try:
        _quiet(
            dcp_load, target, storage_reader=VerifiedReader(files, where=where), no_dist=_alone()
        )
    except BaseException as err:
        if not dcp_failure(err):
            raise
        inner = _first(err)[1]
        if isinstance(inner, RecoveryError):
            raise inner from err
        raise


def state_of(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What DCP writes of ``model`` and ``optimizer``, and what ``state.json`` keeps.

    Returns:
        The tensors (``{"model": ..., "optimizer": ...}``: the live tensors, not
        copies; FSDP2's DTensors as they are) and the optimizer's param groups.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optimizer": osd["state"]}, {"param_groups": osd["param_groups"]}


def write(
    tensors: dict[str, Any], directory: Path, *, process_group: dist.ProcessGroup | None = None
) -> dict[str, tuple[str, int]]:
    """Write ``tensors`` (as :func:`state_of` gives them, or host copies of the same layout)
    into ``directory`` with DCP: collective over ``process_group`` (default: the job's).

    Returns:
        The files this rank wrote (names relative to ``directory``; rank 0's include DCP's
        ``.metadata``) -> (sha256, size), each hashed while it was fsynced.

    Raises:
        BaseException: DCP's failure, :func:`dcp_failure` (the caller says what it means).
    """
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from recovery.integrity.reads.dcp import HashingWriter

    writer = HashingWriter(directory)
    _quiet(
        dcp_save,
        tensors,
        storage_writer=writer,
        process_group=process_group,
        no_dist=_alone(),
    )
    return writer.records


def save(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path
) -> dict[str, Any]:
    """Write model and optimizer tensors with DCP (collective: every rank calls it).

    Returns:
        What ``state.json`` keeps: the optimizer's param groups.
    """
    tensors, groups = state_of(model, optimizer)
    write(tensors, directory)
    return groups


def load(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    files: dict[str, Any],
    saved: dict[str, Any],
    *,
    where: Path,
) -> None:
    """Load model and optimizer from a verified checkpoint's ``dcp/`` bytes (collective).

    The tensors are read into copies of the live state and applied only when
    every one has been read, so a refused load changes nothing.

    Raises:
        IncompatibleStateError: the saved tensors or param groups do not fit.
    """
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optimizer)
    groups = saved.get("param_groups")
    if not isinstance(groups, list) or len(groups) != len(osd["param_groups"]):
        found = len(groups) if isinstance(groups, list) else "no"
        raise IncompatibleStateError(
            f"{where}: {found} optimizer param groups saved, "
            f"{len(osd['param_groups'])} now; resume with the optimizer that wrote it",
            mismatches=["optimizer param groups"],
            path=where,
        )
    target = tree_map_only(
        torch.Tensor, lambda t: t.detach().clone(), {"model": msd, "optimizer": osd["state"]}
    )
    try:
        _read(target, files, where=where)
    except RecoveryError:
        raise
    except BaseException as err:
        if not dcp_failure(err):
            raise
        reason = failure(err)
        raise IncompatibleStateError(
            f"{where}: the sharded model/optimizer state does not fit this run: {reason}. "
            "Resume with the model and optimizer that wrote it.",
            mismatches=[reason],
            path=where,
        ) from err
    set_state_dict(
        model,
        optimizer,
        model_state_dict=target["model"],
        optim_state_dict={"state": target["optimizer"], "param_groups": groups},
    )
