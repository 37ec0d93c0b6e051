"""A resume from the local tier against the raw read of its bytes, for each way of hashing.

    python benchmarks/bench_tiers_resume.py [--size-mb 256] [--rounds 5] [--shm DIR] [--json OUT]

One process writes a continuation checkpoint of ``--size-mb`` of float32 parameters into
``--shm`` (RAM, as a local snapshot is) with each option, then reads it back twice: its
files into memory (the raw read), and ``recovery.run.restoring.choose.load`` (signature, every
digest, decode). The options: ``checkpoint.hash`` sha256 or blake3; ``checkpoint.shard_mb``
0 (one file per component) or a quarter of the state (four files, read and hashed on every
core at once); and, for blake3, hashing each chunk with the ``blake3`` package's
``max_threads=AUTO`` instead of one thread (an experiment: the product hashes with one thread
a file, here :func:`recovery.format.digests.new` is swapped for the run). The options are
alternated round by round, so that a change of load hits each; medians of ``--rounds``.
:func:`local_resume` is the same measurement of a snapshot a run left (bench_tiers.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def raw_and_verified(path: Path) -> tuple[float, float]:
    """Seconds to read the files of checkpoint ``path`` into memory, and to load it verified."""
    from recovery.integrity.keys.signing import TrustStore
    from recovery.run.restoring import choose

    began = time.perf_counter()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        f.read_bytes()
    raw = time.perf_counter() - began
    began = time.perf_counter()
    choose.load(path, TrustStore([]), allow_untrusted=True)
    return raw, time.perf_counter() - began


def local_resume(shm: Path) -> dict[str, float]:
    """The newest local snapshot under ``shm``: its verified load (signature, every
    digest, decode) against a raw read of its files, medians of 3 alternated."""
    from recovery.format.layout import scan

    held = [c for rank in shm.glob("*/rank0") for c in scan(rank).committed]
    if not held:
        return {}
    times = [raw_and_verified(max(held)[1]) for _ in range(3)]
    r, o = statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)
    return {"raw_read_s": r, "verified_load_s": o, "ratio": o / r}


def hashing(threads: bool) -> Callable[[str], Any]:
    """A stand-in for :func:`recovery.format.digests.new`: blake3 with ``max_threads=AUTO``
    when ``threads``, else the product's own."""
    import blake3

    from recovery.format import digests

    own = digests.new

    def new(algorithm: str) -> Any:
        if threads and algorithm == digests.BLAKE3:
            return blake3.blake3(max_threads=blake3.blake3.AUTO)
        return own(algorithm)

    return new


def options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each option's save (synchronous, into RAM) and its resume against the raw read."""
    import torch

    from recovery import CheckpointConfig, Checkpointer, TrainState
    from recovery.format import digests

    width = 1024
    layers = max(1, int(args.size_mb * (1 << 20)) // (width * width * 4))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(layers)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    state = TrainState(model=model, optimizer=opt, absent={"scheduler": "-", "sampler": "-"})
    quarter = args.size_mb / 4
    chosen = [("sha256", 0.0, False), ("sha256", quarter, False), ("blake3", 0.0, False)]
    chosen += [("blake3", 0.0, True), ("blake3", quarter, False), ("blake3", quarter, True)]
    got: dict[tuple[str, float, bool], dict[str, list[float]]] = {
        o: {"save_s": [], "raw_read_s": [], "verified_load_s": []} for o in chosen
    }
    own = digests.new
    where = Path(tempfile.mkdtemp(prefix="bench-tiers-resume-", dir=args.shm))
    try:
        for n in range(args.rounds):
            for algorithm, shard, threads in chosen:
                digests.new = hashing(threads)  # type: ignore[assignment]
                run = where / f"{algorithm}-{shard}-{threads}-{n}"
                cfg = CheckpointConfig(every_steps=1, keep_last=2, hash=algorithm, shard_mb=shard)
                with Checkpointer(cfg, run, final_step=1, config={"bench": 1}) as ckpt:
                    ckpt.restore(state)  # a fresh run
                    began = time.perf_counter()
                    path = ckpt.save(state, 1)
                    ckpt.flush()
                    took = time.perf_counter() - began
                raw, verified = raw_and_verified(path)
                for key, value in (("save_s", took), ("raw_read_s", raw)):
                    got[(algorithm, shard, threads)][key].append(value)
                got[(algorithm, shard, threads)]["verified_load_s"].append(verified)
                shutil.rmtree(run)
    finally:
        digests.new = own  # type: ignore[assignment]
        shutil.rmtree(where, ignore_errors=True)
    out = {}
    for (algorithm, shard, threads), runs in got.items():
        name = f"hash={algorithm} shard_mb={shard:g} max_threads={'AUTO' if threads else 1}"
        row = {k: statistics.median(v) for k, v in runs.items()}
        ratios = [v / r for v, r in zip(runs["verified_load_s"], runs["raw_read_s"], strict=True)]
        out[name] = {**row, "ratio": statistics.median(ratios)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=float, default=256.0)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--shm", type=Path, default=Path("/dev/shm"))
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    args.shm.mkdir(parents=True, exist_ok=True)
    before = os.getloadavg()
    rows = options(args)
    print(f"{args.size_mb:g} MiB, medians of {args.rounds}, load average {before[0]:.2f} before")
    for name, r in rows.items():
        print(
            f"  {name:<42} save {r['save_s']:.3f} s, raw read {r['raw_read_s']:.3f} s, "
            f"verified load {r['verified_load_s']:.3f} s ({r['ratio']:.2f}x raw)"
        )
    if args.json:
        out = {"args": {k: str(v) for k, v in vars(args).items()}, "load_average": before}
        args.json.write_text(json.dumps({**out, "options": rows}, indent=2))


if __name__ == "__main__":
    main()
