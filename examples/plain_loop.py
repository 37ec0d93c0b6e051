"""A plain PyTorch training loop, made exactly resumable by eight lines of recovery.

No Hydra, no recipes: a shuffled DataLoader with worker processes, random
augmentation, dropout, an LR scheduler, gradient accumulation and (``--amp``)
autocast with a GradScaler. Kill it at any moment and run the same command
again: it resumes from the newest verified checkpoint and trains exactly the
run it would have trained.

    python examples/plain_loop.py --run-dir runs/plain
"""

import argparse
from pathlib import Path

import torch
from torch import nn

from recovery import CheckpointConfig, Checkpointer, ResumableLoader, TrainState


class Points(torch.utils.data.Dataset):
    """512 labelled points of a fixed teacher; each load adds fresh noise (augmentation)."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(512, 16, generator=g)
        self.y = (self.x @ torch.randn(16, 4, generator=g)).argmax(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.1 * torch.randn(16), self.y[i]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10, help="checkpoint every this many steps")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--persistent", action="store_true", help="keep the workers for the run")
    p.add_argument("--amp", action="store_true", help="bfloat16 autocast and a GradScaler")
    args = p.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=args.steps)
    scaler = torch.amp.GradScaler("cpu", enabled=args.amp)
    loader = ResumableLoader(
        Points(), 16, seed=0, num_workers=args.workers, persistent_workers=args.persistent
    )
    state = TrainState(model=model, optimizer=opt, scheduler=sched, sampler=loader, scaler=scaler)
    config = CheckpointConfig(every_steps=args.every)
    with Checkpointer(config, args.run_dir, final_step=args.steps) as ckpt:
        step = ckpt.restore(state, "latest")  # a fresh start when there is nothing to resume
        micro, loss_sum = 0, 0.0
        while step < args.steps:
            for x, y in loader:
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp):
                    loss = nn.functional.cross_entropy(model(x), y) / args.accum
                scaler.scale(loss).backward()
                micro, loss_sum = micro + 1, loss_sum + loss.item()
                if micro % args.accum:
                    continue
                scaler.step(opt)
                scaler.update()
                opt.zero_grad()
                sched.step()
                step += 1
                ckpt.record(step, loss=loss_sum)  # metrics.jsonl, watched for resume health
                ckpt.maybe_save(state, step)
                loss_sum = 0.0
                if step == args.steps:
                    break


if __name__ == "__main__":
    main()
