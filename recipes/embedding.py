"""The embedding recipe: user and item embeddings trained on the interaction log.

A dot-product model with per-user and per-item biases and dropout on the
embeddings, binary cross-entropy on click labels, Adam, and a warmup-then-
cosine learning rate keyed on the global step. Every piece of state that the
next step depends on is registered in one :class:`TrainState`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from recipes import common
from recipes.common import seed_everything, warmup_cosine
from recipes.data import DataConfig, Interactions, load
from recipes.outcome import Outcome
from recovery.config import TrainConfig, typed
from recovery.config.checks import at_least, positive, refuse, within
from recovery.errors import ConfigError
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.state.registry import TrainState
from recovery.state.sampler import ResumableSampler

log = logging.getLogger(__name__)

FIXED_ON_RESUME = {
    "recipe.optim.lr": "the optimizer's and LR schedule's state",
    "recipe.optim.weight_decay": "the optimizer's state",
}
"""Keys a resume restores from the checkpoint, whatever the command line says."""

SPARSE_OPTIMIZER = "sparse_optimizer"
SPARSE_SCHEDULER = "sparse_scheduler"
"""With ``recipe.optim.sparse``: the tables' SparseAdam and its schedule, registered beside
``optimizer`` (the dense parameters' Adam) and ``scheduler``."""


@dataclass(kw_only=True)
class ModelConfig:
    dim: int = 32
    """Embedding width."""
    dropout: float = 0.1
    """Dropout on both embeddings during training."""

    def __post_init__(self) -> None:
        positive("recipe.model.dim", self.dim, 32)
        within("recipe.model.dropout", self.dropout, 0.0, 1.0, open_high=True)


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 0.01
    """Peak learning rate (reached at the end of warmup)."""
    weight_decay: float = 0.0
    warmup_steps: int = 100
    """Linear warmup length, in optimizer steps."""
    min_lr_ratio: float = 0.05
    """Cosine decay floor as a fraction of ``lr``."""
    sparse: bool = False
    """``recipe.optim.sparse``: embedding tables with sparse gradients
    (``nn.Embedding(sparse=True)``) trained by ``torch.optim.SparseAdam``, which updates
    only the rows a batch touched (the moments of the others stay as they are, unlike
    dense Adam's); the dense global bias keeps Adam. Both follow the same LR schedule.
    Single process only for now."""

    def __post_init__(self) -> None:
        if self.sparse and self.weight_decay:
            raise refuse(
                "recipe.optim.weight_decay",
                f"{self.weight_decay} with recipe.optim.sparse=true; SparseAdam has no weight "
                "decay",
                0,
            )
        positive("recipe.optim.lr", self.lr, 0.01)
        at_least("recipe.optim.weight_decay", self.weight_decay, 0, 0.0)
        at_least("recipe.optim.warmup_steps", self.warmup_steps, 0, 100)
        within("recipe.optim.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)


@dataclass(kw_only=True)
class EmbeddingConfig:
    name: str = "embedding"
    batch_size: int = 256
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        positive("recipe.batch_size", self.batch_size, 256)


class DotProduct(nn.Module):
    """score(u, i) = <drop(E_u), drop(E_i)> + b_u + b_i + b."""

    def __init__(
        self, num_users: int, num_items: int, dim: int, dropout: float, *, sparse: bool = False
    ) -> None:
        super().__init__()
        self.user = nn.Embedding(num_users, dim, sparse=sparse)
        self.item = nn.Embedding(num_items, dim, sparse=sparse)
        self.user_bias = nn.Embedding(num_users, 1, sparse=sparse)
        self.item_bias = nn.Embedding(num_items, 1, sparse=sparse)
        # shape (1,), not (): FSDP2 shards along dim 0 and refuses scalars
        self.bias = nn.Parameter(torch.zeros(1))
        self.drop = nn.Dropout(dropout)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)

    def tables(self) -> list[nn.Embedding]:
        """The embedding tables (every parameter but the global bias)."""
        return [self.user, self.item, self.user_bias, self.item_bias]

    def forward(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        u = self.drop(self.user(users))
        v = self.drop(self.item(items))
        score: torch.Tensor = (
            (u * v).sum(-1)
            + self.user_bias(users).squeeze(-1)
            + self.item_bias(items).squeeze(-1)
            + self.bias
        )
        return score


def holdout_scores(model: nn.Module, data: Interactions) -> torch.Tensor:
    """The model's scores on the held-out interactions (eval mode: no dropout, no RNG draw)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            part = data.holdout
            scores: torch.Tensor = model(data.users[part], data.items[part])
            return scores
    finally:
        model.train(was_training)


def metrics_at(loss: float, model: nn.Module, data: Interactions) -> dict[str, float]:
    """What a checkpoint records: the step's training loss and the held-out log loss."""
    return {"loss": loss, **evaluate(model, data)}


def evaluate(model: nn.Module, data: Interactions) -> dict[str, float]:
    """Held-out log loss: recorded with every checkpoint, checked again at export."""
    if data.num_train == len(data):
        return {}
    scores = holdout_scores(model, data)
    loss = nn.functional.binary_cross_entropy_with_logits(scores, data.labels[data.holdout])
    return {"val_logloss": float(loss)}


def build(
    rc: EmbeddingConfig,
    data: Interactions,
    *,
    seed: int,
    total_steps: int,
    world: World = distributed.SINGLE,
    strategy: str = "ddp",
) -> tuple[nn.Module, TrainState]:
    """The module to call and the full training state of a fresh run.

    In a ``torchrun`` job every rank builds the same initial weights (same
    seed), then ``ddp`` wraps them for gradient averaging (the state holds
    the unwrapped, replicated module) or ``fsdp`` shards them in place; each
    rank's random streams are then seeded apart, from (seed, 0, rank).
    """
    seed_everything(seed)
    sparse = rc.optim.sparse
    model = DotProduct(
        rc.data.num_users, rc.data.num_items, rc.model.dim, rc.model.dropout, sparse=sparse
    )
    net = common.parallelize(model, world, strategy, parts=[model.user, model.item])
    schedule = warmup_cosine(rc.optim.warmup_steps, total_steps, rc.optim.min_lr_ratio)
    tables = [p for t in model.tables() for p in t.parameters()]
    dense = [model.bias] if sparse else list(model.parameters())
    opt = torch.optim.Adam(dense, lr=rc.optim.lr, weight_decay=rc.optim.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    extra: dict[str, Any] = {}
    if sparse:
        tables_opt = torch.optim.SparseAdam(tables, lr=rc.optim.lr)
        extra = {
            SPARSE_OPTIMIZER: tables_opt,
            SPARSE_SCHEDULER: torch.optim.lr_scheduler.LambdaLR(tables_opt, schedule),
        }
    sampler = ResumableSampler(data.num_train, rc.batch_size, seed)
    if world.distributed:
        distributed.reseed(seed, 0, world.rank)
    return net, TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler, **extra)


def model_config(rc: EmbeddingConfig) -> dict[str, object]:
    """What rebuilds this recipe's model: recorded in every artifact for warm starts."""
    return {
        "recipe": rc.name,
        "class": "DotProduct",
        "num_users": rc.data.num_users,
        "num_items": rc.data.num_items,
        "dim": rc.model.dim,
        "dropout": rc.model.dropout,
    }


def run(cfg: DictConfig) -> Outcome:
    """Train (or resume, or warm-start) the embedding recipe as ``cfg`` says; return 0."""
    rc = typed(EmbeddingConfig, cfg.recipe, key="recipe")
    train = typed(TrainConfig, cfg.train, key="train")
    world, strategy = common.join(cfg)
    if rc.batch_size % world.size:
        raise ConfigError(
            f"recipe.batch_size: {rc.batch_size} does not split over {world.size} ranks; "
            "choose a multiple of the world size"
        )
    if rc.optim.sparse and world.distributed:
        raise ConfigError(
            "recipe.optim.sparse=true is not supported under torchrun yet (sparse gradients "
            "across ranks); run it in one process, or set recipe.optim.sparse=false"
        )
    data = distributed.leader_first(partial(load, rc.data))
    net, state = build(
        rc, data, seed=int(cfg.seed), total_steps=train.steps, world=world, strategy=strategy
    )
    model = state.components["model"]
    opt = state.components["optimizer"]
    opts = [opt, *([state.components[SPARSE_OPTIMIZER]] if rc.optim.sparse else [])]
    scheds = [state.components["scheduler"]]
    scheds += [state.components[SPARSE_SCHEDULER]] if rc.optim.sparse else []
    sampler: ResumableSampler = state.components["sampler"]
    # summed, then divided by the *global* batch size and scaled by the world size: DDP/FSDP
    # average gradients over ranks, so this is the global batch's mean gradient even when
    # the slices are uneven (the short last batch of an epoch) or empty
    loss_fn = nn.BCEWithLogitsLoss(reduction="sum")

    def one_step() -> common.StepResult:
        epoch, ids = sampler.next_batch()  # the global batch: every rank draws the same
        index = torch.from_numpy(ids[world.rank :: world.size])  # this rank's slice
        lr = float(opt.param_groups[0]["lr"])
        logits = net(data.users[index], data.items[index])
        loss = loss_fn(logits, data.labels[index]) * (world.size / len(ids))
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        for o in opts:
            o.step()
        for sched in scheds:
            sched.step()
        # the global batch's loss (the mean over ranks), the same number at any world size
        return common.StepResult(epoch, ids.tolist(), float(distributed.mean(loss).item()), lr)

    net.train()
    return common.train(
        cfg,
        state,
        one_step,
        metrics=lambda loss: metrics_at(loss, model, data),
        data_root=Path(rc.data.root),
        model_cfg=model_config(rc),
        examples=len(data),
        best_metric="val_logloss",
        fixed_on_resume=FIXED_ON_RESUME,
        world=world,
        strategy=strategy,
    )
