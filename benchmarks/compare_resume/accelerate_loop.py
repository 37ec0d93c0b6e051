"""The same loop made resumable with HF Accelerate (save_state/load_state + skip_first_batches).

Follows Accelerate's "Checkpointing" guide and its mid-epoch resume recipe: automatic checkpoint
naming, the scheduler registered for checkpointing, an own step counter, and
``skip_first_batches`` for the first (partial) epoch after a restart. Lines that exist only for
checkpoint/resume carry a trailing ``# ckpt`` marker so ``run_compare.py`` can count them;
``# log`` marks benchmark-only logging.

Usage:
    python accelerate_loop.py --workdir DIR --log FILE [--steps 60] [--ckpt-every 10]
"""

from __future__ import annotations

import json
import os
import random
import time

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration  # ckpt
from common import Points, base_parser, make_model, make_schedule, step_record
from torch import nn


class Progress:  # ckpt
    """Own step counter, registered with Accelerate so save_state/load_state carry it."""

    def __init__(self) -> None:  # ckpt
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0  # ckpt

    def state_dict(self):  # ckpt
        return {"step": self.step, "epoch": self.epoch, "batch": self.batch_in_epoch}  # ckpt

    def load_state_dict(self, sd) -> None:  # ckpt
        self.step, self.epoch, self.batch_in_epoch = sd["step"], sd["epoch"], sd["batch"]  # ckpt


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--no-aug", action="store_true", help="diagnostic: no augmentation noise")
    p.add_argument(
        "--seedable-sampler",
        action="store_true",
        help="diagnostic: DataLoaderConfiguration(use_seedable_sampler=True)",
    )
    p.add_argument(
        "--loader-generator",
        action="store_true",
        help="diagnostic: DataLoader(generator=torch.Generator().manual_seed(0)) as in dcp_loop",
    )
    p.add_argument(
        "--naive-iteration",
        action="store_true",
        help="do not re-sync project_configuration.iteration after load_state",
    )
    args = p.parse_args()

    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)

    project = ProjectConfiguration(  # ckpt
        project_dir=args.workdir,  # ckpt
        automatic_checkpoint_naming=True,  # ckpt
    )  # ckpt
    accelerator = Accelerator(
        cpu=True,
        project_config=project,  # ckpt
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=args.seedable_sampler),
    )
    loader = torch.utils.data.DataLoader(
        Points(augment=not args.no_aug),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=2,
        generator=torch.Generator().manual_seed(0) if args.loader_generator else None,
    )
    model = make_model(args.hidden)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    total = args.steps
    scheduler = make_schedule(optimizer, total)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()  # ckpt
    accelerator.register_for_checkpointing(scheduler, progress)  # ckpt

    def emit(rec) -> None:
        with open(args.log, "a") as f:
            f.write(json.dumps(rec) + "\n")

    ckpt_root = os.path.join(args.workdir, "checkpoints")  # ckpt
    if os.path.isdir(ckpt_root) and os.listdir(ckpt_root):  # ckpt
        accelerator.load_state()  # picks the highest checkpoint_<n>  # ckpt
        latest = max(int(d.rsplit("_", 1)[-1]) for d in os.listdir(ckpt_root))  # ckpt
        if not args.naive_iteration:
            # load_state does not restore the save counter (accelerate issues #1601, #3306);
            # without this the next save_state raises "Checkpoint directory ... already exists".
            accelerator.project_configuration.iteration = latest + 1  # ckpt
        emit({"event": "resume", "dir": f"checkpoint_{latest}", "step": progress.step})  # log
    else:
        emit({"event": "start"})

    model.train()
    while progress.step < total:
        active = loader
        if progress.batch_in_epoch:  # ckpt
            active = accelerator.skip_first_batches(loader, progress.batch_in_epoch)  # ckpt
        for x, y, idx in active:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            progress.step += 1
            progress.batch_in_epoch += 1  # ckpt
            step = progress.step
            emit(step_record(step, loss, scheduler, idx, x))
            if step % args.ckpt_every == 0:  # ckpt
                t0 = time.perf_counter()  # log
                out = accelerator.save_state()  # ckpt
                dt = time.perf_counter() - t0  # log
                emit({"event": "saved", "dir": os.path.basename(out), "seconds": dt})  # log
            if step >= total:
                break
        else:
            progress.epoch += 1  # ckpt
            progress.batch_in_epoch = 0  # ckpt

    unwrapped = accelerator.unwrap_model(model)
    torch.save(unwrapped.state_dict(), os.path.join(args.workdir, "final_params.pt"))
    emit({"event": "done"})


if __name__ == "__main__":
    main()
