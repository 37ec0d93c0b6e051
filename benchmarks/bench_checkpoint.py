"""Checkpoint save/load speed against what people use today, measured in one process.

    python benchmarks/bench_checkpoint.py [--size-gb 1.0] [--runs 5] [--dir DIR] [--json OUT]

State: a transformer-shaped fp32 model plus Adam's two moments (about 1 GiB at
the default size, ~300 tensors). Every method saves the same tensors into the
same directory, followed by fsync where the method leaves that to the caller;
files are deleted between runs. Reported: the median of ``--runs`` runs in
seconds, and each method's ratio to its floor (raw write + fsync for saves,
the preallocated-buffer memcpy for the async pause, torch.load for loads).

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
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp

from recovery import commit, resume, snapshot, tensorfile
from recovery.signing import Signer, TrustStore, generate_keypair
from recovery.staging import Staging


def make_state(size_gb: float) -> dict[str, Any]:
    """A model state_dict and an Adam state_dict, ~``size_gb`` GiB together (3 x params)."""
    d = 1024
    per_layer = 3 * d * d + 3 * d + d * d + d + 4 * d * d + 4 * d + 4 * d * d + d + 4 * d
    layers = max(1, round(size_gb * (1 << 30) / 4 / 3 / per_layer))
    g = torch.Generator().manual_seed(0)
    model: dict[str, torch.Tensor] = {"embed.weight": torch.randn(2048, d, generator=g)}
    for i in range(layers):
        p = f"layers.{i}."
        model |= {
            p + "attn.qkv.weight": torch.randn(3 * d, d, generator=g),
            p + "attn.qkv.bias": torch.randn(3 * d, generator=g),
            p + "attn.out.weight": torch.randn(d, d, generator=g),
            p + "attn.out.bias": torch.randn(d, generator=g),
            p + "mlp.fc1.weight": torch.randn(4 * d, d, generator=g),
            p + "mlp.fc1.bias": torch.randn(4 * d, generator=g),
            p + "mlp.fc2.weight": torch.randn(d, 4 * d, generator=g),
            p + "mlp.fc2.bias": torch.randn(d, generator=g),
            p + "ln1.weight": torch.ones(d),
            p + "ln1.bias": torch.zeros(d),
            p + "ln2.weight": torch.ones(d),
            p + "ln2.bias": torch.zeros(d),
        }
    state = {
        i: {"step": torch.tensor(100.0), "exp_avg": torch.randn_like(t), "exp_avg_sq": torch.rand_like(t)}
        for i, t in enumerate(model.values())
    }
    groups = [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "params": list(state)}]
    return {"model": model, "optimizer": {"state": state, "param_groups": groups}}


def flat(tree: dict[str, Any]) -> dict[str, torch.Tensor]:
    out = dict(tree["model"])
    for i, s in tree["optimizer"]["state"].items():
        for k, v in s.items():
            out[f"opt.{i}.{k}"] = v
    return out


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def fsync_tree(path: Path) -> None:
    for f in [path] if path.is_file() else sorted(path.rglob("*")):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def peak_rss_child(size_gb: float, workdir: Path) -> float:
    """Extra peak RSS of an async save (stage + background commit), in state sizes."""
    code = f"""
import sys, threading, time, json
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
import bench_checkpoint as b
from pathlib import Path
from recovery import commit, snapshot
from recovery.staging import Staging
from recovery.signing import Signer
tree = b.make_state({size_gb})
size = b.nbytes(b.flat(tree))
signer = Signer(Path({str(workdir / 'key' / 'recovery.key')!r}))
staging = Staging()
staging.stage(tree)  # buffers allocated once, as in training
def rss(field):
    for line in open('/proc/self/status'):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
base = rss('VmRSS:')
open('/proc/self/clear_refs', 'w').write('5')  # reset the peak to now
staged = staging.stage(tree)
files = snapshot.encode_split(staged.skeletons, staged.tensors, step=1, meta={{}})
final = Path({str(workdir)!r}) / 'mem' / 'step-00000001'
final.parent.mkdir(parents=True, exist_ok=True)
t = threading.Thread(target=commit.commit, args=(final, files, {{'step': 1}}), kwargs={{'signer': signer}})
t.start(); t.join()
print(json.dumps({{'extra': (rss('VmHWM:') - base) / size, 'buffers': staging.allocated_bytes / size}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # the buffers exist before the save (allocated once per run); count them as the extra memory
    return float(result["extra"] + result["buffers"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where files are written (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args(argv)

    work = Path(args.dir or tempfile.mkdtemp(prefix="recovery-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    generate_keypair(work / "key", overwrite=True)
    signer = Signer(work / "key" / "recovery.key")
    trust = TrustStore()
    trust.add_pem(signer.public_pem, source="bench")

    tree = make_state(args.size_gb)
    tensors = flat(tree)
    size = nbytes(tensors)
    print(f"state: {len(tensors)} tensors, {size / 2**30:.3f} GiB; {args.runs} runs; dir {work}", flush=True)

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
        path = fresh() / "dcp"
        dcp.save({"model": tree["model"], "optimizer": tensors_only(tree)}, checkpoint_id=str(path), no_dist=True)
        fsync_tree(path)

    def ours_sync() -> None:
        run_dir = fresh()
        files = snapshot.encode(tree, step=1, meta={"run_id": "bench"})
        commit.commit(run_dir / "step-00000001", files, {"step": 1}, signer=signer)

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
        "memcpy floor": memcpy,
        "ours async pause": ours_pause,
    }
    loads: dict[str, tuple[Callable[[], None], Callable[[], Any]]] = {
        "torch.load": (torch_save, lambda: torch.load(target / "ckpt.pt", weights_only=True)),
        "safetensors load": (st_save, lambda: safetensors.torch.load_file(str(target / "ckpt.safetensors"))),
        "DCP load": (dcp_save, lambda: dcp_load(target / "dcp", tree)),
        "ours load+verify": (ours_sync, lambda: resume.load(target / "step-00000001", trust)),
    }
    times: dict[str, list[float]] = {k: [] for k in [*saves, *loads]}
    for run in range(args.runs):
        for name, fn in saves.items():
            times[name].append(timed(fn))
        for name, (prepare, load) in loads.items():
            prepare()
            times[name].append(timed(load))
        print(f"run {run + 1}/{args.runs} done", flush=True)
    shutil.rmtree(target, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    mem = peak_rss_child(args.size_gb, work)

    floors = {"save": med["raw write+fsync"], "pause": med["memcpy floor"], "load": med["torch.load"]}
    rows = []
    for name in saves:
        floor = "pause" if name in ("memcpy floor", "ours async pause") else "save"
        rows.append((name, med[name], med[name] / floors[floor], floor))
    for name in loads:
        rows.append((name, med[name], med[name] / floors["load"], "load"))
    print(f"\n{'method':<20} {'median s':>9} {'ratio':>7}  vs")
    for name, sec, ratio, floor in rows:
        vs = {"save": "raw write+fsync", "pause": "memcpy floor", "load": "torch.load"}[floor]
        print(f"{name:<20} {sec:>9.3f} {ratio:>7.2f}  {vs}")
    print(f"{'async extra peak':<20} {mem:>9.2f} x state size")
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__},
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


def tensors_only(tree: dict[str, Any]) -> dict[str, Any]:
    """The optimizer state as DCP stores it (nested dicts of tensors; groups as plain values)."""
    return {str(i): s for i, s in tree["optimizer"]["state"].items()}


def dcp_load(path: Path, tree: dict[str, Any]) -> None:
    # DCP loads in place into preallocated tensors of the right shapes
    target = {
        "model": {k: torch.empty_like(v) for k, v in tree["model"].items()},
        "optimizer": {i: {k: torch.empty_like(v) for k, v in s.items()} for i, s in tensors_only(tree).items()},
    }
    dcp.load(target, checkpoint_id=str(path), no_dist=True)


if __name__ == "__main__":
    sys.exit(main())
