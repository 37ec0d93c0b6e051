"""Checkpoint save and restore of a state on a GPU, against what people use there.

    python benchmarks/bench_gpu.py [--size-gb 4.0] [--runs 3] [--dir DIR] [--json OUT]

The state is ``bench_checkpoint.py``'s (a transformer-shaped model and Adam's two
moments, ``--size-gb`` in all), on the GPU, registered with the public API as a run
registers it (``TrainState(model=..., optimizer=...)``). Each method's median of
``--runs``, every save followed by fsync where the method leaves that to the caller:

- floors: the device-to-host copy into pinned buffers allocated once (the async
  pause's floor), and a parallel raw write of those host bytes (a thread per file,
  fsync each: the save's floor);
- ``torch.save`` + fsync and ``dcp.save`` + fsync (one process) of the same state;
- ours: the sync save (``Checkpointer.save``, ``checkpoint.async=false``), the async
  pause (``save`` returning) and its total (``save`` and ``flush``);
- restore onto the GPU: ``torch.load(map_location=cuda)``, ``dcp.load`` into the
  state's tensors, and ours (``Checkpointer.restore``: verify every byte, decode,
  copy to the device).

Without CUDA it prints one line saying so and exits 0 (``--device cpu`` runs the same
steps on the CPU, a smoke check of the script; its figures are not the GPU's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(BENCH.parent))

from workload import fsync_tree, make_state  # noqa: E402

from recovery import CheckpointConfig, Checkpointer, TrainState  # noqa: E402
from recovery.config.checkpoint import DvcConfig  # noqa: E402
from recovery.integrity.keys.signing import Signer, TrustStore, generate_keypair  # noqa: E402

NO_DVC = DvcConfig(enabled=False)


def synced(device: torch.device, fn: Callable[[], object]) -> float:
    """Seconds ``fn`` takes, the device's queue drained before and after."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    began = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - began


def measure(device: torch.device, fn: Callable[[], float | None]) -> float:
    """Seconds ``fn`` takes, or those it returns: ours time their own part (the save or
    the restore alone, not the checkpointer's start and close)."""
    got: list[float | None] = []
    whole = synced(device, lambda: got.append(fn()))
    return got[0] if got[0] is not None else whole


def build(size_gb: float, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The benchmark's model on ``device`` and an Adam with its moments in place."""
    tree = make_state(size_gb)
    model = nn.Module()
    model.params = nn.ParameterList(nn.Parameter(t.to(device)) for t in tree["model"].values())
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()  # its moments exist, on the device
    opt.zero_grad(set_to_none=True)
    return model, opt


def state_of(model: nn.Module, opt: torch.optim.Optimizer) -> TrainState:
    absent = {"scheduler": "constant lr", "sampler": "a benchmark, no data"}
    return TrainState(model=model, optimizer=opt, absent=absent)


def tensors_of(model: nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    moments = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    return [*(p.detach() for p in model.parameters()), *moments]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-gb", type=float, default=4.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", help="where to write (default: a temporary directory)")
    p.add_argument("--json", type=Path)
    p.add_argument("--device", default="cuda", help="cuda (default); cpu: a smoke check")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        why = f"no CUDA device here (torch {torch.__version__}); nothing measured"
        print(f"bench_gpu: {why}")
        if args.json:
            args.json.write_text(json.dumps({"skipped": why}, indent=1) + "\n")
        return 0
    work = Path(args.dir or tempfile.mkdtemp(prefix="recovery-bench-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = bench(args.size_gb, args.runs, device, work)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def bench(size_gb: float, runs: int, device: torch.device, work: Path) -> dict[str, Any]:
    generate_keypair(work / "key", overwrite=True)
    signer = Signer(work / "key" / "recovery.key")
    trust = TrustStore()
    trust.add_pem(signer.public_pem, source="bench")
    model, opt = build(size_gb, device)
    state = state_of(model, opt)
    tensors = tensors_of(model, opt)
    size = sum(t.numel() * t.element_size() for t in tensors)
    pin = device.type == "cuda"
    host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for t in tensors]
    print(f"state: {len(tensors)} tensors, {size / 2**30:.3f} GiB on {device}", flush=True)

    def fresh(name: str) -> Path:
        path = work / name
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        return path

    def pinned_copy() -> None:
        for h, t in zip(host, tensors, strict=True):
            h.copy_(t, non_blocking=True)

    def raw_write() -> None:
        out = fresh("raw")
        groups = [host[i :: os.cpu_count() or 1] for i in range(os.cpu_count() or 1)]

        def one(i: int, group: list[torch.Tensor]) -> None:
            with open(out / f"{i}.bin", "wb") as fh:
                for t in group:
                    fh.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
                fh.flush()
                os.fsync(fh.fileno())

        threads = [threading.Thread(target=one, args=(i, g)) for i, g in enumerate(groups) if g]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def torch_save() -> None:
        out = fresh("pt") / "ckpt.pt"
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, out)
        fsync_tree(out)

    def dcp_save() -> None:
        import torch.distributed.checkpoint as dcp

        out = fresh("dcp")
        dcp.save({"model": model.state_dict()}, checkpoint_id=str(out), no_dist=True)
        fsync_tree(out)

    def ours(async_save: bool) -> tuple[Checkpointer, Callable[[], Path]]:
        cfg = CheckpointConfig(async_save=async_save, every_steps=1, keep_last=2, dvc=NO_DVC)
        ck = Checkpointer(
            cfg, fresh("ours-async" if async_save else "ours"), final_step=10**6, signer=signer,
            trust=trust, preemption=False, health=False,
        )  # fmt: skip
        ck.restore(state)
        step = iter(range(1, 10**6))
        return ck, lambda: ck.save(state, next(step))

    def ours_sync() -> float:
        ck, save = ours(False)
        with ck:  # only the save is timed: not the checkpointer's start or its close
            return synced(device, save)

    pause_s: list[float] = []
    total_s: list[float] = []

    def ours_async() -> float:
        ck, save = ours(True)
        with ck:
            began = time.perf_counter()
            save()
            pause_s.append(time.perf_counter() - began)
            ck.flush()
            total_s.append(time.perf_counter() - began)
        return total_s[-1]

    def torch_load() -> None:
        torch.load(work / "pt" / "ckpt.pt", map_location=device, weights_only=True)

    def dcp_load() -> None:
        import torch.distributed.checkpoint as dcp

        dcp.load({"model": model.state_dict()}, checkpoint_id=str(work / "dcp"), no_dist=True)

    def ours_restore() -> float:
        cfg = CheckpointConfig(every_steps=1, dvc=NO_DVC)
        latest = sorted((work / "ours").glob("step-*"))[-1]
        target = state_of(*build_like(model, opt))
        shutil.rmtree(work / "restored", ignore_errors=True)
        with Checkpointer(
            cfg, work / "restored", final_step=10**6, signer=signer, trust=trust,
            preemption=False, health=False,
        ) as ck:  # fmt: skip
            return synced(device, lambda: ck.restore(target, latest))

    methods: dict[str, Callable[[], float | None]] = {
        "pinned copy floor" if pin else "host copy floor": pinned_copy,
        "parallel raw write floor": raw_write,
        "torch.save+fsync": torch_save,
        "dcp.save+fsync (model)": dcp_save,
        "ours sync": ours_sync,
        "ours async (call + flush)": ours_async,
        "torch.load to device": torch_load,
        "dcp.load to device (model)": dcp_load,
        "ours restore to device": ours_restore,
    }
    times: dict[str, list[float]] = {k: [] for k in methods}
    for run in range(runs):
        for name, fn in methods.items():
            times[name].append(measure(device, fn))
        print(f"run {run + 1}/{runs} done", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    med["ours async pause"] = statistics.median(pause_s)
    med["ours async total"] = statistics.median(total_s)
    floor_copy = med["pinned copy floor" if pin else "host copy floor"]
    rows = {
        name: {"median_s": sec, "gb_s": size / sec / 1e9 if sec > 0 else None}
        for name, sec in med.items()
    }
    rows["ours async pause"]["over_copy_floor"] = med["ours async pause"] / floor_copy
    rows["ours sync"]["over_async_total"] = med["ours sync"] / med["ours async total"]
    rows["ours restore to device"]["over_torch_load"] = (
        med["ours restore to device"] / med["torch.load to device"]
    )
    print(f"\n{'method':<34} {'median s':>9} {'GB/s':>7}")
    for name, row in rows.items():
        print(f"{name:<34} {row['median_s']:>9.3f} {row['gb_s'] or 0:>7.2f}")
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "state_bytes": size,
        "runs": runs,
        "methods": rows,
        "all_s": times,
    }


def build_like(model: nn.Module, opt: torch.optim.Optimizer) -> tuple[nn.Module, Any]:
    """An empty model and Adam of ``model``'s shapes on its device: a restore's target."""
    target = nn.Module()
    target.params = nn.ParameterList(nn.Parameter(torch.empty_like(p)) for p in model.parameters())
    adam = torch.optim.Adam(target.parameters(), lr=1e-4)
    for p in target.parameters():
        p.grad = torch.zeros_like(p)
    adam.step()
    adam.zero_grad(set_to_none=True)
    return target, adam


if __name__ == "__main__":
    sys.exit(main())
