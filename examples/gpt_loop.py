"""A GPT-style loop: random windows of a token stream, the next batch fetched before the step.

The shape of many language-model scripts: batches are windows at random offsets of
one long tensor of tokens (drawn from the global torch generator, so there is no
data loader and no position), the learning rate is a function of the step (warm-up
then cosine, set by hand every step), gradients are accumulated over micro-batches
and clipped, and the next batch is fetched right after the forward pass, while
the backward pass runs. That fetched batch is loop state: a checkpoint between
two steps must hold it, or a resumed run trains on another batch. It is
registered as a ``LoopState``; the rest is the usual eight lines.

    python examples/gpt_loop.py --run-dir runs/gpt
"""

import argparse
import logging
import math
from pathlib import Path

import torch
from torch import nn

from recovery import CheckpointConfig, Checkpointer, LoopState, TrainState

VOCAB, CONTEXT = 48, 16


def token_stream() -> torch.Tensor:
    """20,000 tokens of a fixed random walk: each token is the last plus 0, 1 or 2
    (modulo the vocabulary), something a model can learn."""
    g = torch.Generator().manual_seed(1)
    return torch.cumsum(torch.randint(3, (20_000,), generator=g), 0) % VOCAB


class TinyGPT(nn.Module):
    """Token and position embeddings, one causal self-attention block, a tied head."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, dim)
        self.pos = nn.Embedding(CONTEXT, dim)
        self.block = nn.TransformerEncoderLayer(dim, 2, 2 * dim, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, VOCAB, bias=False)
        self.head.weight = self.tok.weight
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(CONTEXT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
        return self.head(self.block(h, src_mask=self.mask, is_causal=True))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--every", type=int, default=10, help="checkpoint every this many steps")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    data = token_stream()

    def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
        starts = torch.randint(len(data) - CONTEXT - 1, (args.batch,))  # the global generator
        x = torch.stack([data[s : s + CONTEXT] for s in starts])
        y = torch.stack([data[s + 1 : s + 1 + CONTEXT] for s in starts])
        return x, y

    def lr_at(step: int, peak: float = 3e-3, warmup: int = 5) -> float:
        if step < warmup:
            return peak * (step + 1) / warmup
        return 0.5 * peak * (1 + math.cos(math.pi * (step - warmup) / max(1, args.steps - warmup)))

    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=lr_at(0), weight_decay=0.1)
    carry = LoopState(batch=None)  # the batch fetched ahead of the next step
    state = TrainState(
        model=model,
        optimizer=opt,
        loop=carry,
        absent={
            "scheduler": "lr is lr_at(step), set every step",
            "sampler": "batches are torch.randint offsets from the captured rng",
        },
    )
    with Checkpointer(CheckpointConfig(every_steps=args.every), args.run_dir,
                      final_step=args.steps) as ckpt:  # fmt: skip
        step = ckpt.restore(state, "latest")
        if carry.batch is None:  # a fresh run fetches its first batch; a resume restored it
            carry.batch = get_batch()
        while step < args.steps:
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            total = 0.0
            for _ in range(args.accum):
                x, y = carry.batch
                logits = model(x)
                loss = nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()) / args.accum
                carry.batch = get_batch()  # fetched while this micro-batch's backward runs
                loss.backward()
                total += loss.item()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            ckpt.record(step, loss=total)
            ckpt.maybe_save(state, step)


if __name__ == "__main__":
    main()
