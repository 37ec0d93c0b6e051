"""Two tiers of checkpoints: a local one in RAM every few steps, a persistent one promoted from it.

Design (issue 30):

- **Where the local tier lives.** ``<checkpoint.local.root>/<run name>-<12 hex of
  sha256(run dir path)>/rank<r>/`` (default root ``/dev/shm/recovery-{uid}``: RAM,
  one root per user), a directory laid out like a run directory (``step-N/``,
  temp names while writing), derived from the run directory's path and not from
  the run id, so a restarted process finds it before it knows which run it
  resumes. The run directory's lock keeps a second writer of the run out; other
  users of a shared ``/dev/shm`` are kept out by :mod:`recovery.integrity.commits.private`
  (every directory from the root down this user's, 0700, no link, held open and
  re-checked before each write and before it is removed).
- **What a snapshot is.** A continuation checkpoint in every respect: the same
  :class:`~recovery.run.writing.job.SaveJob` as a persistent save of that step, written by
  the same commit protocol (temp directory, hash while writing, fsync, signed
  ``model.sig`` last, rename; fault points ``local-*-N``), signed by the run's
  signer (one ECDSA signature of a small statement: microseconds against the
  hashing), verified by the same reader before anything is deserialised. Its
  signed statement says ``"tier": "local"``: a local snapshot copied anywhere is
  never taken for a durable checkpoint.
- **Promotion, not a second save.** Every ``checkpoint.every_steps`` (and at the
  end) the step's local snapshot is taken as usual, then a background thread
  copies its listed files into the run directory, hashing each as it is
  written and comparing with the snapshot's signed digests, and commits them
  with the same protocol under a re-signed statement (``tier`` dropped,
  ``promoted: true``; the same files, so the same root digest), then does what
  follows any commit (lineage link, retention, cost record, DVC). The training
  thread pauses once, for the local snapshot. At most one promotion is in
  flight; the next one waits for it (so the persistent tier can lose up to two
  intervals, as async saves do, while a process crash loses at most one local
  interval). A preemption's save and ``+resume=<step>`` stay persistent-only.
- **Resume across tiers.** ``latest`` walks :func:`order` (newest step first; at
  one step the local copy first, it is read from RAM) and takes the first that
  verifies, falling back past damaged or missing ones as before. The journal's
  ``resume`` record and every lineage link carry the tier.
- **Retention.** Local: after a snapshot commits, every older one is deleted
  (:func:`retire`), except the one a promotion in flight is copying; so at most
  :data:`HELD` snapshots exist at once (promoting, newest, being written). A
  resume discards local snapshots newer than the step it resumed (another branch).
  Persistent: as before (``keep_last``...); a snapshot found in the run directory
  (its statement says ``tier: local``) is neither counted nor deleted, nor resumed
  by ``latest``, nor pushed to DVC (:func:`not_durable`). When the run ends with its
  newest snapshot's step committed in the persistent tier (not merely submitted:
  a failed promotion keeps its snapshot), the local directory is removed.
- **RAM budget.** At start-up the snapshot's size (the state's tensor bytes now)
  times :data:`HELD` must fit the room there is (:func:`available`: the root's free
  space, for a root in RAM at most the memory available less ``checkpoint.async``'s
  staging copy), else a one-line :class:`~recovery.errors.StorageError` before the
  first step; what it reserves is logged and journaled (``local_tier``). A fresh
  run's optimizer state only exists after its first step, so the check runs again
  with the first committed snapshot's real size, before a second is written.
- **Pause.** Synchronous: the snapshot's whole write into RAM. With
  ``checkpoint.async``: the copy into reused host buffers; the write runs on a
  background thread, and a snapshot due while the previous one is still written
  is skipped (counted), never waited for, unless its step is to be promoted.
- **Interval per tier.** :func:`plan` (``recovery plan --local-cost``): Young/Daly for
  each tier's cost and the failures only it recovers from.
- **Under torchrun** (DDP, or FSDP2: a rank's own shards): each rank snapshots its own
  state and peers hold copies of it, so a lost node's ranks restore from RAM too
  (:mod:`recovery.run.tiers.peers`); a persistent step is promoted from every rank's
  snapshot, read back verified and written by the collective save in the background
  (:mod:`recovery.run.tiers.collective`).
- **Not built yet:** differential snapshots (refused together with the tier), a snapshot
  resumed on another world size, and an automatic local interval at run time
  (``checkpoint.local.every_steps`` is fixed).
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from pathlib import Path

from recovery.errors import ConfigError, StorageError
from recovery.integrity.commits import private

LOCAL = "local"
PERSISTENT = "persistent"
HELD = 3
"""Local snapshots that can exist at once: the one a promotion copies, the newest, and the
one being written."""


def local_dir(root: str | Path, run_dir: Path, rank: int) -> Path:
    """This rank's local-tier directory for ``run_dir``: one per run directory and rank
    (``root``'s ``{uid}`` and ``~`` expanded: :func:`recovery.integrity.commits.private.expand`)."""
    resolved = Path(run_dir).resolve()
    tag = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return private.expand(root) / f"{resolved.name}-{tag}" / f"rank{rank}"


@dataclass(frozen=True)
class Candidate:
    """A committed checkpoint of either tier, not yet verified."""

    step: int
    tier: str
    path: Path


def order(
    persistent: Sequence[tuple[int, Path]], local: Sequence[tuple[int, Path]]
) -> list[Candidate]:
    """The order ``latest`` tries checkpoints in: newest step first, and at one step the
    local copy before the persistent one (the same state, read from RAM)."""
    found = [Candidate(s, PERSISTENT, p) for s, p in persistent]
    found += [Candidate(s, LOCAL, p) for s, p in local]
    return sorted(found, key=lambda c: (-c.step, c.tier != LOCAL))


def not_durable(path: Path) -> str:
    """Why a local snapshot found outside its local directory is passed over (a resume,
    retention, DVC): it is not a persistent checkpoint, whatever its name."""
    return (
        f"{path}: is a local-tier snapshot (its signed statement says tier: local), not a "
        "persistent checkpoint; it is never counted as one. Move it out of the run directory"
    )


class Pins:
    """Counts who holds each snapshot (a promotion, a copy to peers), so none is retired
    while read.

    A step stays pinned while any reader holds it: one reader's release never un-pins
    another's. Safe across threads."""

    def __init__(self) -> None:
        self._held: Counter[int] = Counter()
        self._lock = threading.Lock()

    def add(self, step: int) -> None:
        """One more reader holds ``step``."""
        with self._lock:
            self._held[step] += 1

    def discard(self, step: int) -> None:
        """One reader of ``step`` is done with it."""
        with self._lock:
            self._held[step] -= 1
            if self._held[step] <= 0:
                del self._held[step]

    def __contains__(self, step: object) -> bool:
        with self._lock:
            return isinstance(step, int) and self._held[step] > 0


def retire(held: Sequence[tuple[int, Path]], newest: int, pinned: Container[int]) -> list[Path]:
    """The local snapshots to delete once step ``newest`` committed: every older one, except
    those ``pinned`` (a promotion or a copy to peers is reading them). A later one is kept:
    under torchrun retiring waits for the peers, and the next snapshot may be there by then."""
    return [p for s, p in held if s < newest and s not in pinned]


def newer(held: Sequence[tuple[int, Path]], step: int) -> list[Path]:
    """The local snapshots a run that (re)starts at ``step`` discards: later steps of a
    branch it does not continue."""
    return [p for s, p in held if s > step]


def room(snapshot_bytes: int, available: int, copies: int = HELD) -> str | None:
    """Why ``copies`` snapshots of ``snapshot_bytes`` (:data:`HELD`, and peers' copies under
    torchrun) do not fit in ``available`` bytes (``None``: they fit)."""
    need = copies * snapshot_bytes
    if need <= available:
        return None
    return f"needs {_mb(need)} ({copies} snapshots of {_mb(snapshot_bytes)}), {_mb(available)} free"


RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
"""Filesystems whose files are held in memory: a root there is bounded by RAM too."""


def available(free: int, ram: int | None, held: int, staging: int) -> int:
    """The room for the local tier's snapshots: the root's ``free`` bytes plus the ``held``
    snapshots' (they are replaced); for a root in RAM (``ram``: the memory available, else
    ``None``) at most that plus ``held``, less the ``staging`` buffers still to be allocated
    (``checkpoint.async``: one more copy of the state, in host memory)."""
    room = free + held
    return room if ram is None else max(0, min(room, ram + held - staging))


def mounted_type(path: Path, mounts: str) -> str | None:
    """The filesystem type of the mount holding ``path`` (absolute, resolved), from the text
    of ``/proc/mounts`` (the innermost mount point, the last one mounted there)."""
    best, kind = "", None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def mem_available(meminfo: str) -> int | None:
    """``MemAvailable`` in bytes, from the text of ``/proc/meminfo`` (``None``: absent)."""
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        if name == "MemAvailable" and value.split():
            return int(value.split()[0]) * 1024
    return None


def cgroup_room(cgroups: str, read: Callable[[str], str | None]) -> int | None:
    """The memory this process's cgroups leave it (the least, over the cgroup and its
    parents, of limit minus use), from the text of ``/proc/self/cgroup``; ``read(path)``
    gives a file under ``/sys/fs/cgroup`` (``None``: unreadable). ``None``: no limit.

    A job's memory limit (SLURM's ``ConstrainRAMSpace``, a Kubernetes pod's) counts the
    pages of a RAM filesystem it writes, and the host's ``MemAvailable`` does not see it.
    cgroup v2 (``0::/path``: ``memory.max``, ``memory.current``) and v1 (the ``memory``
    controller: ``memory.limit_in_bytes``, ``memory.usage_in_bytes``).
    """
    rooms = []
    for line in cgroups.splitlines():
        hierarchy, controllers, rest = [*line.split(":", 2), "", ""][:3]
        if hierarchy == "0" and controllers == "":
            base, limit, used = "", "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit, used = "memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        parts = [p for p in rest.split("/") if p]
        for depth in range(len(parts), -1, -1):
            where = "/".join([base, *parts[:depth]]).strip("/")
            cap, now = read(f"{where}/{limit}".lstrip("/")), read(f"{where}/{used}".lstrip("/"))
            if cap and now and cap.strip().isdigit() and now.strip().isdigit():
                rooms.append(max(0, int(cap) - int(now)))
    return min(rooms) if rooms else None


def _read_cgroup(name: str) -> str | None:
    try:
        return (Path("/sys/fs/cgroup") / name).read_text()
    except OSError:
        return None


def ram_available(path: Path) -> int | None:
    """The memory available when ``path`` is on a filesystem held in RAM
    (:data:`RAM_FILESYSTEMS`): the host's (``/proc/meminfo``), bounded by what the
    process's cgroups leave it (:func:`cgroup_room`); ``None`` elsewhere (or where
    ``/proc`` cannot tell)."""
    try:
        kind = mounted_type(path.resolve(), Path("/proc/mounts").read_text())
        if kind not in RAM_FILESYSTEMS:
            return None
        host = mem_available(Path("/proc/meminfo").read_text())
        job = cgroup_room(Path("/proc/self/cgroup").read_text(), _read_cgroup)
    except OSError:
        return None
    known = [n for n in (host, job) if n is not None]
    return min(known) if known else None


def size(path: Path) -> int:
    """The bytes of the files under ``path`` (a snapshot directory)."""
    total = 0
    for f in path.rglob("*"):
        with contextlib.suppress(FileNotFoundError):  # retired meanwhile (another thread)
            total += f.stat().st_size if f.is_file() and not f.is_symlink() else 0
    return total


def fit(
    where: Path, snapshot_bytes: int, held: Sequence[Path], *, staging: int, copies: int = HELD
) -> int:
    """Refuse (:func:`check_room`) when ``copies`` snapshots of ``snapshot_bytes`` do not
    fit the room at ``where`` (:func:`available`, the snapshots ``held`` there counted as
    free); return that room.

    Raises:
        StorageError: they do not fit.
    """
    free, ram = shutil.disk_usage(where).free, ram_available(where)
    room = available(free, ram, sum(size(p) for p in held), staging)
    check_room(where, snapshot_bytes, room, copies)
    return room


def check_room(where: Path, snapshot_bytes: int, available: int, copies: int = HELD) -> None:
    """Refuse a local tier that would not fit (:func:`room`), in one line.

    Raises:
        StorageError: it does not fit.
    """
    why = room(snapshot_bytes, available, copies)
    if why is not None:
        raise StorageError(
            f"checkpoint.local.root: the local tier in {where} {why}; free RAM (or /dev/shm's "
            "size), choose another checkpoint.local.root=, or set checkpoint.local.every_steps=0",
            path=where,
        )


def check_supported(*, differential: bool) -> None:
    """Refuse what the local tier does not implement yet, by name.

    Raises:
        ConfigError: differential checkpoints with ``checkpoint.local.every_steps``.
    """
    if differential:
        raise ConfigError(
            "checkpoint.local.every_steps is not supported with checkpoint.differential yet; "
            "set one of checkpoint.local.every_steps=0 or checkpoint.differential.enabled=false"
        )


def young_daly(cost_s: float, mtbf_s: float) -> float:
    """sqrt(2 * C * MTBF): the first-order optimal interval for a checkpoint costing
    ``cost_s`` against failures every ``mtbf_s`` on average."""
    return float((2.0 * cost_s * mtbf_s) ** 0.5)


def plan(cost_s: float, local_cost_s: float, mtbf_s: float, host_loss: float) -> dict[str, float]:
    """Young/Daly per tier, and the work lost per failure with one tier and with two.

    One tier: T = sqrt(2 C MTBF); a failure loses T/2 on average and checkpoints cost
    C * day / T. Two tiers: a share ``host_loss`` (0 < h < 1) of the failures takes the node
    and its RAM with it and resumes from the persistent tier; the others resume from RAM.
    Each tier's interval is Young/Daly for its own cost and the failures only it recovers
    from: T_local = sqrt(2 C_local MTBF / (1 - h)), T_persistent = sqrt(2 C MTBF / h). A
    failure loses (1 - h) T_local / 2 + h T_persistent / 2 on average; checkpoints cost
    C_local day / T_local + C day / T_persistent a day (a persistent checkpoint is charged
    its one-tier cost C, though a promotion pauses the run only for its snapshot: an upper
    bound).
    """
    day = 86400.0
    one = young_daly(cost_s, mtbf_s)
    local = young_daly(local_cost_s, mtbf_s / (1.0 - host_loss))
    persistent = young_daly(cost_s, mtbf_s / host_loss)
    lost_one, lost_two = one / 2.0, (1.0 - host_loss) * local / 2.0 + host_loss * persistent / 2.0
    cost_one = cost_s * day / one
    cost_two = local_cost_s * day / local + cost_s * day / persistent
    return {
        "one_tier_interval_s": one,
        "one_tier_loss_per_failure_s": lost_one,
        "one_tier_checkpoint_cost_per_day_s": cost_one,
        "one_tier_total_per_day_s": cost_one + day / mtbf_s * lost_one,
        "local_interval_s": local,
        "persistent_interval_s": persistent,
        "two_tier_loss_per_failure_s": lost_two,
        "two_tier_checkpoint_cost_per_day_s": cost_two,
        "two_tier_total_per_day_s": cost_two + day / mtbf_s * lost_two,
        "fewer_lost": lost_one / lost_two,
    }


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
