"""A recurrent language model trained by truncated backprop through time over one tensor.

The shape of word-level LSTM scripts: the corpus is one long tensor of token ids cut
into ``batch`` parallel columns, the loop walks it ``bptt`` tokens at a time and
carries the LSTM's hidden state from one chunk to the next (detached), and at the
end of each epoch it evaluates on held-out text and anneals the learning rate by
hand when the validation loss did not improve. Three things here are loop state no
module, optimizer or loader holds: the hidden state, the position in the tensor,
and the best validation loss. They live in a ``LoopState``. The epoch's end work
(evaluation, annealing) is done on the epoch's last chunk *before* that step's
``maybe_save``, so a checkpoint there already holds its result.

    python examples/bptt_loop.py --run-dir runs/bptt
"""

import argparse
import logging
from pathlib import Path

import torch
from torch import nn

from recovery import CheckpointConfig, Checkpointer, LoopState, TrainState

VOCAB = 40


def corpus(n: int, seed: int) -> torch.Tensor:
    """``n`` token ids of a fixed random second-order process."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(VOCAB, VOCAB, VOCAB, generator=torch.Generator().manual_seed(7))
    table = torch.softmax(2 * weights, -1)
    out = torch.zeros(n, dtype=torch.long)
    for i in range(2, n):
        out[i] = torch.multinomial(table[out[i - 2], out[i - 1]], 1, generator=g)
    return out


def columns(tokens: torch.Tensor, batch: int) -> torch.Tensor:
    """The token stream as ``batch`` parallel columns, shape ``(length, batch)``."""
    length = len(tokens) // batch
    return tokens[: length * batch].view(batch, length).t().contiguous()


class LSTMModel(nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.drop = nn.Dropout(0.2)
        self.rnn = nn.LSTM(dim, dim)
        self.out = nn.Linear(dim, VOCAB)

    def forward(
        self, x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, hidden = self.rnn(self.drop(self.embed(x)), hidden)
        return self.out(self.drop(h)), hidden

    def init_hidden(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        zeros = torch.zeros(1, batch, self.rnn.hidden_size)
        return zeros, zeros.clone()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--every", type=int, default=10, help="checkpoint every this many steps")
    p.add_argument("--bptt", type=int, default=12)
    p.add_argument("--batch", type=int, default=8)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    train, val = columns(corpus(1920, 1), args.batch), columns(corpus(600, 2), args.batch)
    loss_fn = nn.CrossEntropyLoss()

    def evaluate(model: LSTMModel) -> float:
        model.eval()
        hidden, total = model.init_hidden(args.batch), 0.0
        with torch.no_grad():
            for i in range(0, len(val) - 1, args.bptt):
                x, y = val[i : i + args.bptt], val[i + 1 : i + 1 + args.bptt]
                out, hidden = model(x[: len(y)], hidden)
                total += len(y) * loss_fn(out.flatten(0, 1), y.flatten()).item()
        model.train()
        return total / (len(val) - 1)

    torch.manual_seed(0)
    model = LSTMModel()
    opt = torch.optim.SGD(model.parameters(), lr=2.0)
    carry = LoopState(pos=0, hidden=model.init_hidden(args.batch), best=float("inf"))
    state = TrainState(
        model=model,
        optimizer=opt,
        loop=carry,
        absent={
            "scheduler": "lr annealed by hand at each epoch's end (the optimizer holds it)",
            "sampler": "the position is the bptt offset, carry.pos, in the loop state",
        },
    )
    with Checkpointer(CheckpointConfig(every_steps=args.every), args.run_dir,
                      final_step=args.steps) as ckpt:  # fmt: skip
        step = ckpt.restore(state, "latest")
        while step < args.steps:
            x = train[carry.pos : carry.pos + args.bptt]
            y = train[carry.pos + 1 : carry.pos + 1 + args.bptt]
            hidden = tuple(h.detach() for h in carry.hidden)  # truncate the graph here
            out, carry.hidden = model(x[: len(y)], hidden)
            loss = loss_fn(out.flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            opt.step()
            step += 1
            carry.pos += args.bptt
            if carry.pos >= len(train) - 1:  # the epoch's last chunk: its end work, then save
                val_loss = evaluate(model)
                if val_loss < carry.best:
                    carry.best = val_loss
                else:
                    for group in opt.param_groups:
                        group["lr"] /= 4.0
                carry.pos, carry.hidden = 0, model.init_hidden(args.batch)
            ckpt.record(step, loss=loss.item())
            ckpt.maybe_save(state, step)


if __name__ == "__main__":
    main()
