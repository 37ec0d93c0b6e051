"""Checkpoint save/load speed against what people use today, measured in one process.

    python benchmarks/bench_checkpoint.py [--size-gb 1.0] [--runs 5] [--dir DIR] [--json OUT]
    python benchmarks/bench_checkpoint.py --scaling 0.25,1,4 [--runs 3] [--json OUT]

State: a transformer-shaped fp32 model plus Adam's two moments (about 1 GiB at
the default size, ~300 tensors, 1024 wide; narrower below 0.15 GiB: see
``workload.py``). Every method saves the same tensors into the same directory,
followed by fsync where the method leaves that to the caller; files are
deleted between runs. Each load runs in a fresh child process, as a
resume does (in one long-lived process, the allocator hands later loads warm
memory that a resuming process never has), forked from a helper that only
imported the modules (``forked.py``), timed around the load call alone,
with the file in the page cache for every method alike. Reported: the median
of ``--runs`` runs in seconds, and each method's ratio to its floor (raw write
+ fsync for saves, the preallocated-buffer memcpy for the async pause,
torch.load for loads). "ours" writes with the defaults a run gets
(``checkpoint.shard_mb`` shards, sha256, every file of a save or a load on its
own thread); "one file per component" is the same commit unsharded, and
"blake3" the same with ``checkpoint.hash=blake3``.

``--scaling`` times only ours (sync save, verified load) and the floors (raw
write+fsync, torch.load) at each state size, as seconds per GiB.

Extra peak memory of an async save is measured in a child process (its own
peak RSS, reset just before the save), as a multiple of the state size.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from recovery.config import CheckpointConfig
from recovery.integrity.commits import commit
from recovery.integrity.keys.signing import Signer, TrustStore, generate_keypair
from recovery.run.restoring import choose
from recovery.run.writing.staging import Staging
from recovery.state import snapshot

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forked import HELPER_FLAG, Helper, serve  # this directory's modules
from workload import flat, fsync_tree, make_state, nbytes, tensors_only

HELPER = Helper(__file__)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def peak_rss_child(size_gb: float, workdir: Path) -> float:
    """Extra peak RSS of an async save (stage + background commit), in state sizes,
    measured in a fresh child process."""
    return _child(["--peak-child"], workdir, size_gb)


def _child(mode: list[str], work: Path, size_gb: float) -> float:
    """``mode``'s number, measured in a fresh child process (see :mod:`forked`)."""
    return HELPER.measure([*mode, "--dir", str(work), "--size-gb", str(size_gb)])


def measure(argv: list[str]) -> float:
    """A child's measurement: ``--load-child KIND`` or ``--peak-child``."""
    args = parser().parse_args(argv)
    if args.peak_child:
        return child_peak(Path(args.dir), args.size_gb)
    return child_load(args.load_child, Path(args.dir), args.size_gb)


def _rss(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def child_peak(work: Path, size_gb: float) -> float:
    tree = make_state(size_gb)
    size = nbytes(flat(tree))
    signer = Signer(work / "key" / "recovery.key")
    base = _rss("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to now
    staging = Staging()
    staged = staging.stage(tree)  # the buffers: allocated at a run's first save, then reused
    files = snapshot.encode_split(staged.skeletons, staged.tensors, step=1, meta={})
    final = work / "mem" / "step-00000001"
    final.parent.mkdir(parents=True, exist_ok=True)
    thread = threading.Thread(
        target=commit.commit, args=(final, files, {"step": 1}), kwargs={"signer": signer}
    )
    thread.start()
    thread.join()
    shutil.rmtree(final.parent, ignore_errors=True)
    return (_rss("VmHWM:") - base) / size


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where files are written (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument(
        "--scaling", default=None, help="comma-separated GiB sizes: the scaling table only"
    )
    ap.add_argument("--load-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--peak-child", action="store_true", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == [HELPER_FLAG]:
        serve(measure, preload=("torch.distributed.checkpoint",))
        return 0
    args = parser().parse_args(argv)
    try:
        return bench(args)
    finally:
        HELPER.close()


def bench(args: argparse.Namespace) -> int:

    work = Path(args.dir or tempfile.mkdtemp(prefix="recovery-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    generate_keypair(work / "key", overwrite=True)
    signer = Signer(work / "key" / "recovery.key")
    trust = TrustStore()
    trust.add_pem(signer.public_pem, source="bench")
    if args.scaling:
        sizes = [float(x) for x in args.scaling.split(",")]
        table = scaling(sizes, args.runs, work, signer)
        if args.json:
            Path(args.json).write_text(json.dumps({"scaling": table}, indent=1))
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
        return 0

    tree = make_state(args.size_gb)
    tensors = flat(tree)
    size = nbytes(tensors)
    print(
        f"state: {len(tensors)} tensors, {size / 2**30:.3f} GiB; {args.runs} runs; dir {work}",
        flush=True,
    )

    staging = Staging()
    staging.stage(tree)  # allocate once, as a run does at its first save
    buffers = {k: torch.empty_like(v) for k, v in tensors.items()}
    for k, t in tensors.items():
        buffers[k].copy_(t)  # touch them once: the floor is a copy into warm memory
    target = work / "out"

    def fresh() -> Path:
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        return target

    def raw_write() -> None:
        path = fresh() / "raw.bin"
        with open(path, "wb") as fh:
            for t in tensors.values():
                fh.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            fh.flush()
            os.fsync(fh.fileno())

    def torch_save() -> None:
        path = fresh() / "ckpt.pt"
        torch.save(tree, path)
        fsync_tree(path)

    def st_save() -> None:
        path = fresh() / "ckpt.safetensors"
        safetensors.torch.save_file(tensors, str(path))
        fsync_tree(path)

    def dcp_save() -> None:
        import torch.distributed.checkpoint as dcp

        path = fresh() / "dcp"
        dcp.save(
            {"model": tree["model"], "optimizer": tensors_only(tree)},
            checkpoint_id=str(path),
            no_dist=True,
        )
        fsync_tree(path)

    def ours_sync() -> None:
        ours_commit(fresh(), tree, signer)

    def ours_unsharded() -> None:
        ours_commit(fresh(), tree, signer, shard_bytes=0)

    def ours_blake3() -> None:
        ours_commit(fresh(), tree, signer, hash_type="blake3")

    def ours_pause() -> None:
        staging.stage(tree)

    def memcpy() -> None:
        for k, t in tensors.items():
            buffers[k].copy_(t)

    saves: dict[str, Callable[[], None]] = {
        "raw write+fsync": raw_write,
        "torch.save+fsync": torch_save,
        "safetensors+fsync": st_save,
        "DCP save": dcp_save,
        "ours sync": ours_sync,
        "ours sync, one file per component": ours_unsharded,
        "ours sync, blake3": ours_blake3,
        "memcpy floor": memcpy,
        "ours async pause": ours_pause,
    }
    loads: dict[str, tuple[Callable[[], None], str]] = {
        "torch.load": (torch_save, "torch"),
        "safetensors load": (st_save, "safetensors"),
        "DCP load": (dcp_save, "dcp"),
        "ours load+verify": (ours_sync, "ours"),
        "ours load+verify, one file per component": (ours_unsharded, "ours"),
        "ours load+verify, blake3": (ours_blake3, "ours"),
    }
    times: dict[str, list[float]] = {k: [] for k in [*saves, *loads]}
    for run in range(args.runs):
        for name, fn in saves.items():
            times[name].append(timed(fn))
        for name, (prepare, kind) in loads.items():
            prepare()
            times[name].append(load_in_child(kind, work, args.size_gb))
        print(f"run {run + 1}/{args.runs} done", flush=True)
    shutil.rmtree(target, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    mem = peak_rss_child(args.size_gb, work)

    floors = {
        "save": med["raw write+fsync"],
        "pause": med["memcpy floor"],
        "load": med["torch.load"],
    }
    rows = []
    for name in saves:
        floor = "pause" if name in ("memcpy floor", "ours async pause") else "save"
        rows.append((name, med[name], med[name] / floors[floor], floor))
    for name in loads:
        rows.append((name, med[name], med[name] / floors["load"], "load"))
    print(f"\n{'method':<42} {'median s':>9} {'ratio':>7}  vs")
    for name, sec, ratio, floor in rows:
        vs = {"save": "raw write+fsync", "pause": "memcpy floor", "load": "torch.load"}[floor]
        print(f"{name:<42} {sec:>9.3f} {ratio:>7.2f}  {vs}")
    print(f"{'async extra peak':<42} {mem:>9.2f} x state size")
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "state_bytes": size,
        "tensors": len(tensors),
        "runs": args.runs,
        "median_s": med,
        "all_s": times,
        "ratios": {name: ratio for name, _, ratio, _ in rows},
        "async_extra_peak_x_state": mem,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if not args.dir:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def ours_commit(
    run_dir: Path,
    tree: dict[str, Any],
    signer: Signer,
    *,
    shard_bytes: int | None = None,
    hash_type: str = "sha256",
) -> None:
    """Our sync save of ``tree`` into ``run_dir``: the default shard size unless given."""
    shard = CheckpointConfig().shard_bytes if shard_bytes is None else shard_bytes
    files = snapshot.encode(tree, step=1, meta={"run_id": "bench"}, shard_bytes=shard)
    final = run_dir / "step-00000001"
    commit.commit(final, files, {"step": 1}, signer=signer, hash_type=hash_type)


def scaling(sizes: list[float], runs: int, work: Path, signer: Signer) -> dict[str, Any]:
    """Seconds per GiB of ours and the floors at each state size (medians of ``runs``)."""
    table = {f"{size_gb:g}": scale_one(size_gb, runs, work, signer) for size_gb in sizes}
    shutil.rmtree(work / "out", ignore_errors=True)
    return table


def scale_one(size_gb: float, runs: int, work: Path, signer: Signer) -> dict[str, float]:
    """One row of the scaling table."""
    target = work / "out"
    tree = make_state(size_gb)
    tensors = flat(tree)
    gib = nbytes(tensors) / 2**30

    def fresh() -> Path:
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir()
        return target

    def raw_write() -> None:
        with open(fresh() / "raw.bin", "wb") as fh:
            for t in tensors.values():
                fh.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
            fh.flush()
            os.fsync(fh.fileno())

    def torch_save() -> None:
        torch.save(tree, fresh() / "ckpt.pt")
        fsync_tree(target / "ckpt.pt")

    times: dict[str, list[float]] = {k: [] for k in ("raw", "ours sync", "torch", "ours")}
    for _ in range(runs):
        times["raw"].append(timed(raw_write))
        times["ours sync"].append(timed(lambda: ours_commit(fresh(), tree, signer)))
        times["ours"].append(load_in_child("ours", work, size_gb))
        torch_save()
        times["torch"].append(load_in_child("torch", work, size_gb))
    med = {k: statistics.median(v) / gib for k, v in times.items()}
    row = {
        "gib": gib,
        "raw write+fsync s/GiB": med["raw"],
        "ours sync s/GiB": med["ours sync"],
        "sync ratio": med["ours sync"] / med["raw"],
        "torch.load s/GiB": med["torch"],
        "ours load+verify s/GiB": med["ours"],
        "load ratio": med["ours"] / med["torch"],
    }
    print(
        f"{gib:7.2f} GiB  save {row['ours sync s/GiB']:.3f} s/GiB "
        f"({row['sync ratio']:.2f}x raw)  load {row['ours load+verify s/GiB']:.3f} s/GiB "
        f"({row['load ratio']:.2f}x torch.load)",
        flush=True,
    )
    return row


def load_in_child(kind: str, work: Path, size_gb: float) -> float:
    """Seconds one load takes in a fresh process (the load call alone is timed)."""
    return _child(["--load-child", kind], work, size_gb)


def child_load(kind: str, work: Path, size_gb: float) -> float:
    target = work / "out"
    if kind == "torch":
        return timed(lambda: torch.load(target / "ckpt.pt", weights_only=True))
    if kind == "safetensors":
        return timed(lambda: safetensors.torch.load_file(str(target / "ckpt.safetensors")))
    if kind == "dcp":
        import torch.distributed.checkpoint as dcp

        into = make_state(size_gb, fill=False)  # DCP loads in place into preallocated tensors
        state = {"model": into["model"], "optimizer": tensors_only(into)}
        return timed(lambda: dcp.load(state, checkpoint_id=str(target / "dcp"), no_dist=True))
    signer = Signer(work / "key" / "recovery.key")
    trust = TrustStore()
    trust.add_pem(signer.public_pem, source="bench")
    return timed(lambda: choose.load(target / "step-00000001", trust))


if __name__ == "__main__":
    sys.exit(main())
