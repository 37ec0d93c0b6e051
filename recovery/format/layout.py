"""Names on disk and discovery of committed checkpoints.

A run directory holds ``step-NNNNNNNN/`` (committed), ``step-NNNNNNNN.tmp-<id>/``
(being written, or left by a crash) and ``metrics.jsonl``. "Latest" is found by
scanning names, never through a mutable pointer file that a crash could leave
pointing at a half-written directory.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path

STEP_PREFIX = "step-"
TEMP_MARK = ".tmp-"
ASIDE_MARK = ".aside-"
TRASH_MARK = ".trash-"
"""A committed directory being deleted (retention, a replaced best): renamed first, so a
kill mid-deletion leaves a name discovery ignores, never a half-deleted checkpoint."""
ABANDONED_DIR = "abandoned"
"""``<run>/abandoned/<branch>/``: the later checkpoints of a branch the run left."""
SIGNATURE_FILE = "model.sig"
STATE_FILE = "state.json"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
BEST_DIR = "best"
WARM_START_DIR = "warm_start"
"""``<run>/warm_start/``: the checkpoints a run keeps for warm starts (``warm_start_every``)."""
PROGRAM_FILE = "program.pt2"
IO_SIGNATURE_FILE = "signature.json"
TENSOR_SUFFIX = ".safetensors"
DCP_DIR = "dcp"
"""Distributed checkpoints: model and optimizer shards written by torch.distributed.checkpoint."""
DISTRIBUTED = "distributed"
"""``state.json`` key of a distributed checkpoint: world size, strategy, where state lives."""
RANK_DIR = "ranks"
"""Distributed checkpoints: each rank's own state (its RNG streams)."""
RANK_SNAPSHOT = "rank_snapshot"
"""``state.json`` meta of a local snapshot under torchrun: ``{"rank", "world_size"}`` of the
rank whose state it holds (its RNG streams are that rank's alone)."""

_COMMITTED = re.compile(r"^step-(\d{8,})$")
_TEMP = re.compile(r"^step-(\d{8,})\.(tmp|aside|trash)-[0-9a-f]+$")


def is_dcp_shard(name: str) -> bool:
    """Whether a checkpoint's file ``name`` is one of DCP's data files (``dcp/__0_0.distcp``),
    not its ``.metadata``: under ``torchrun`` each rank reads only some of them."""
    return name.startswith(f"{DCP_DIR}/") and not name.endswith("/.metadata")


def step_dir_name(step: int) -> str:
    """``step-00001200`` for step 1200."""
    return f"{STEP_PREFIX}{step:08d}"


def tensor_file(component: str) -> str:
    """The file that holds a component's tensors."""
    return f"{component}{TENSOR_SUFFIX}"


def temp_dir_for(final: Path) -> Path:
    """A unique temporary directory beside ``final`` (same filesystem, so rename is atomic)."""
    return final.with_name(f"{final.name}{TEMP_MARK}{uuid.uuid4().hex[:12]}")


def trash_dir_for(final: Path) -> Path:
    """Where a committed directory is renamed before it is deleted."""
    return final.with_name(f"{final.name}{TRASH_MARK}{uuid.uuid4().hex[:12]}")


def committed_name(stale: str) -> str:
    """``step-N`` of a temp, aside or trash name ``step-N.<mark>-<id>``."""
    return stale.split(".", 1)[0]


def aside_dir_for(final: Path) -> Path:
    """A unique name to move an existing ``final`` aside to before replacing it."""
    return final.with_name(f"{final.name}{ASIDE_MARK}{uuid.uuid4().hex[:12]}")


def parse_step(name: str) -> int | None:
    """The step of a committed directory name, ``None`` for any other name."""
    match = _COMMITTED.fullmatch(name)  # fullmatch: `$` alone also matches before a newline
    return int(match.group(1)) if match else None


def is_uncommitted(name: str) -> bool:
    """Whether ``name`` is a temp or aside directory of an interrupted commit."""
    return _TEMP.fullmatch(name) is not None


@dataclass(frozen=True)
class Listing:
    """What a scan of a run directory found."""

    committed: list[tuple[int, Path]]
    """Committed directories, oldest step first (not yet verified)."""
    stale: list[Path]
    """Temporary or aside directories: writes that never committed."""


def scan(run_dir: Path) -> Listing:
    """List the checkpoint directories in ``run_dir`` (missing dir: empty listing)."""
    committed: list[tuple[int, Path]] = []
    stale: list[Path] = []
    if not run_dir.is_dir():
        return Listing([], [])
    for entry in run_dir.iterdir():
        step = parse_step(entry.name)
        if step is not None and entry.is_dir() and not entry.is_symlink():
            committed.append((step, entry))
        elif _TEMP.fullmatch(entry.name):
            stale.append(entry)
    committed.sort()
    return Listing(committed, sorted(stale))


def refuse_reuse(run_dir: Path) -> None:
    """A fresh or warm-started run starts in a run directory without checkpoints: decided
    from a listing alone (no torch), so ``train.py`` asks it before importing torch too.

    Raises:
        RunDirInUseError: ``run_dir`` holds committed checkpoints.
    """
    from recovery.errors import RunDirInUseError

    if committed := scan(run_dir).committed:
        raise RunDirInUseError(
            f"{run_dir}: already holds checkpoints up to step {committed[-1][0]}. "
            "Pass +resume=latest to continue that run, or choose another run.name= "
            "(or checkpoint.root=) for a new one.",
            path=run_dir,
        )
