"""Plain PyTorch loop made resumable with torch.distributed.checkpoint + StatefulDataLoader.

Written the way the DCP "getting started" tutorial and the torchdata StatefulDataLoader tutorial
describe it, for a single process. Lines that exist only for checkpoint/resume carry a trailing
``# ckpt`` marker so ``run_compare.py`` can count them; ``# log`` marks
benchmark-only logging.

Usage:
    python dcp_loop.py --workdir DIR --log FILE [--steps 60] [--ckpt-every 10] [--hidden 64]
"""

from __future__ import annotations

import json
import os
import pickle  # ckpt
import random
import time

import numpy as np
import torch
import torch.distributed.checkpoint as dcp  # ckpt
from common import Points, base_parser, make_model, make_schedule, step_record
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # ckpt
from torch.distributed.checkpoint.stateful import Stateful  # ckpt
from torchdata.stateful_dataloader import StatefulDataLoader


class PointsWithRngState(Points):  # ckpt worker-rng
    """torchdata tutorial: a dataset with per-worker RNG state exposes state_dict/load_state_dict.

    StatefulDataLoader calls these inside each worker, so the worker's torch RNG is captured.
    """

    def state_dict(self):  # ckpt worker-rng
        return {"torch_rng": torch.get_rng_state()}  # ckpt worker-rng

    def load_state_dict(self, sd) -> None:  # ckpt worker-rng
        torch.set_rng_state(sd["torch_rng"])  # ckpt worker-rng


class AppState(Stateful):  # ckpt
    """Everything that must come back after a restart, as one DCP Stateful."""

    def __init__(self, model, optimizer, scheduler, loader, progress) -> None:  # ckpt
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler  # ckpt
        self.loader, self.progress = loader, progress  # ckpt

    def state_dict(self):  # ckpt
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)  # ckpt
        return {  # ckpt
            "model": model_sd,  # ckpt
            "optim": optim_sd,  # ckpt
            "sched": pickle.dumps(self.scheduler.state_dict()),  # ckpt
            "loader": pickle.dumps(self.loader.state_dict()),  # ckpt
            "torch_rng": torch.get_rng_state(),  # ckpt
            "py_np_rng": pickle.dumps((random.getstate(), np.random.get_state())),  # ckpt
            "progress": pickle.dumps(self.progress),  # ckpt
        }  # ckpt

    def load_state_dict(self, sd) -> None:  # ckpt
        set_state_dict(  # ckpt
            self.model,  # ckpt
            self.optimizer,  # ckpt
            model_state_dict=sd["model"],  # ckpt
            optim_state_dict=sd["optim"],  # ckpt
        )  # ckpt
        self.scheduler.load_state_dict(pickle.loads(sd["sched"]))  # ckpt
        self.loader.load_state_dict(pickle.loads(sd["loader"]))  # ckpt
        torch.set_rng_state(sd["torch_rng"])  # ckpt
        py_state, np_state = pickle.loads(sd["py_np_rng"])  # ckpt
        random.setstate(py_state)  # ckpt
        np.random.set_state(np_state)  # ckpt
        self.progress.update(pickle.loads(sd["progress"]))  # ckpt


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument(
        "--no-worker-rng-state",
        action="store_true",
        help="dataset without state_dict (worker augmentation RNG is not checkpointed)",
    )
    p.add_argument("--no-aug", action="store_true", help="diagnostic: no augmentation noise")
    args = p.parse_args()

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    ckpt_root = os.path.join(args.workdir, "ckpt")  # ckpt
    os.makedirs(ckpt_root, exist_ok=True)  # ckpt

    dataset_cls = Points if args.no_worker_rng_state else PointsWithRngState
    dataset = dataset_cls(augment=not args.no_aug)
    loader = StatefulDataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(0),
    )
    model = make_model(args.hidden)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    total = args.steps
    scheduler = make_schedule(optimizer, total)
    progress = {"step": 0}
    app = AppState(model, optimizer, scheduler, loader, progress)  # ckpt

    def emit(rec) -> None:
        with open(args.log, "a") as f:
            f.write(json.dumps(rec) + "\n")

    found = sorted(d for d in os.listdir(ckpt_root) if d.startswith("step_"))  # ckpt
    if found:  # ckpt
        dcp.load({"app": app}, checkpoint_id=os.path.join(ckpt_root, found[-1]))  # ckpt
        emit({"event": "resume", "dir": found[-1], "step": progress["step"]})  # log
    else:
        emit({"event": "start"})

    model.train()
    while progress["step"] < total:
        for x, y, idx in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            progress["step"] += 1
            step = progress["step"]
            emit(step_record(step, loss, scheduler, idx, x))
            if step % args.ckpt_every == 0:  # ckpt
                t0 = time.perf_counter()  # log
                path = os.path.join(ckpt_root, f"step_{step:06d}")  # ckpt
                dcp.save({"app": app}, checkpoint_id=path)  # ckpt
                dt = time.perf_counter() - t0  # log
                emit({"event": "saved", "dir": os.path.basename(path), "seconds": dt})  # log
            if step >= total:
                break

    torch.save(model.state_dict(), os.path.join(args.workdir, "final_params.pt"))
    emit({"event": "done"})


if __name__ == "__main__":
    main()
