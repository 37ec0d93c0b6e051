"""The embedding recipe: user and item embeddings trained on the interaction log.

A dot-product model with per-user and per-item biases and dropout on the
embeddings, binary cross-entropy on click labels, Adam, and a warmup-then-
cosine learning rate keyed on the global step. Every piece of state that the
next step depends on is registered in one :class:`TrainState`.
"""

from __future__ import annotations

import logging
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from torch import nn
from tqdm import tqdm

from recipes.data import DataConfig, Interactions, load
from recovery import faults, provenance, trust
from recovery.checkpointer import Checkpointer
from recovery.config import CheckpointConfig, RunConfig, SigningConfig, TrainConfig, typed
from recovery.errors import ConfigError, Preempted
from recovery.journal import Journal
from recovery.layout import METRICS_FILE
from recovery.preemption import PreemptionGuard
from recovery.purpose import PurposeSpec
from recovery.sampler import ResumableSampler
from recovery.state import TrainState

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ModelConfig:
    dim: int = 32
    """Embedding width."""
    dropout: float = 0.1
    """Dropout on both embeddings during training."""

    def __post_init__(self) -> None:
        if self.dim <= 0:
            raise ConfigError(f"recipe.model.dim: must be positive, got {self.dim}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"recipe.model.dropout: must be in [0, 1), got {self.dropout}")


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 0.01
    """Peak learning rate (reached at the end of warmup)."""
    weight_decay: float = 0.0
    warmup_steps: int = 100
    """Linear warmup length, in optimizer steps."""
    min_lr_ratio: float = 0.05
    """Cosine decay floor as a fraction of ``lr``."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"recipe.optim.lr: must be positive, got {self.lr}")
        if self.warmup_steps < 0:
            raise ConfigError(f"recipe.optim.warmup_steps: must be >= 0, got {self.warmup_steps}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(
                f"recipe.optim.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}"
            )


@dataclass(kw_only=True)
class EmbeddingConfig:
    name: str = "embedding"
    batch_size: int = 256
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        if self.batch_size <= 0:
            raise ConfigError(f"recipe.batch_size: must be positive, got {self.batch_size}")


class DotProduct(nn.Module):
    """score(u, i) = <drop(E_u), drop(E_i)> + b_u + b_i + b."""

    def __init__(self, num_users: int, num_items: int, dim: int, dropout: float) -> None:
        super().__init__()
        self.user = nn.Embedding(num_users, dim)
        self.item = nn.Embedding(num_items, dim)
        self.user_bias = nn.Embedding(num_users, 1)
        self.item_bias = nn.Embedding(num_items, 1)
        self.bias = nn.Parameter(torch.zeros(()))
        self.drop = nn.Dropout(dropout)
        nn.init.normal_(self.user.weight, std=0.1)
        nn.init.normal_(self.item.weight, std=0.1)
        nn.init.zeros_(self.user_bias.weight)
        nn.init.zeros_(self.item_bias.weight)

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


def warmup_cosine(warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
    """LR factor at a step: linear warmup to 1, then cosine down to ``min_ratio`` at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


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


def seed_everything(seed: int) -> None:
    """Seed every stream a fresh run draws from (a resume overwrites them from the checkpoint)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build(
    rc: EmbeddingConfig, data: Interactions, *, seed: int, total_steps: int
) -> tuple[DotProduct, TrainState]:
    """The model and the full training state of a fresh run."""
    seed_everything(seed)
    model = DotProduct(rc.data.num_users, rc.data.num_items, rc.model.dim, rc.model.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=rc.optim.lr, weight_decay=rc.optim.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(rc.optim.warmup_steps, total_steps, rc.optim.min_lr_ratio)
    )
    sampler = ResumableSampler(data.num_train, rc.batch_size, seed)
    return model, TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler)


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


def hydra_overrides() -> list[str]:
    """The command-line overrides of this Hydra job (empty outside ``@hydra.main``)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return list(HydraConfig.get().overrides.task)


def make_checkpointer(
    cfg: DictConfig,
    ck: CheckpointConfig,
    run_dir: Path,
    *,
    final_step: int,
    data_root: Path,
    model_cfg: dict[str, object],
    journal: Journal,
    preemption: PreemptionGuard | None = None,
) -> Checkpointer:
    """A checkpointer wired to the run's signer, trust store, provenance and purposes."""
    signing_cfg = typed(SigningConfig, cfg.signing, key="signing")
    signer = trust.resolve_signer(signing_cfg)
    resolved = {str(k): v for k, v in OmegaConf.to_container(cfg, resolve=True).items()}  # type: ignore[union-attr]
    redacted, _ = provenance.redact(resolved)
    return Checkpointer(
        ck,
        run_dir,
        final_step=final_step,
        signer=signer,
        trust=trust.resolve_trust(signing_cfg, signer),
        allow_untrusted=signing_cfg.allow_untrusted,
        provenance=provenance.capture(
            config=resolved,
            overrides=hydra_overrides(),
            data=data_root,
            project_root=Path(__file__).resolve().parent.parent,
            outputs=[Path(ck.root), Path("artifacts")],
        ),
        config=redacted,
        model_config=model_cfg,
        purposes={
            name: typed(PurposeSpec, node, key=f"purposes.{name}")
            for name, node in cfg.purposes.items()
        },
        journal=journal,
        preemption=preemption,
    )


def run(cfg: DictConfig) -> int:
    """Train (or resume, or warm-start) the embedding recipe as ``cfg`` says; return 0."""
    rc = typed(EmbeddingConfig, cfg.recipe, key="recipe")
    ck = typed(CheckpointConfig, cfg.checkpoint, key="checkpoint")
    run_cfg = typed(RunConfig, cfg.run, key="run")
    train = typed(TrainConfig, cfg.train, key="train")
    seed = int(cfg.seed)

    data = load(rc.data)
    model, state = build(rc, data, seed=seed, total_steps=train.steps)
    opt = state.components["optimizer"]
    sched = state.components["scheduler"]
    sampler: ResumableSampler = state.components["sampler"]

    run_dir = Path(ck.root) / run_cfg.name
    journal = Journal(run_dir / METRICS_FILE)
    guard = PreemptionGuard(ck.preempt_signals)
    ckpt = make_checkpointer(
        cfg,
        ck,
        run_dir,
        final_step=train.steps,
        data_root=Path(rc.data.root),
        model_cfg=model_config(rc),
        journal=journal,
        preemption=guard,
    )
    step = ckpt.restore(
        state,
        OmegaConf.select(cfg, "resume", default=None),
        init_from=OmegaConf.select(cfg, "init_from", default=None),
    )
    log.info("run %s: step %d of %d, %d examples", run_dir, step, train.steps, len(data))

    loss_fn = nn.BCEWithLogitsLoss()
    model.train()
    # a progress bar on a terminal; plain log lines (below) everywhere else
    bar = tqdm(total=train.steps, initial=step, unit="step", disable=not sys.stderr.isatty())
    guard.install()
    try:
        while step < train.steps:
            epoch, ids = sampler.next_batch()
            index = torch.from_numpy(ids)
            lr = float(opt.param_groups[0]["lr"])
            logits = model(data.users[index], data.items[index])
            loss = loss_fn(logits, data.labels[index])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            loss_value = float(loss.item())
            journal.write(
                {"step": step, "epoch": epoch, "loss": loss_value, "lr": lr, "batch": ids.tolist()}
            )
            bar.update(1)
            ckpt.maybe_save(state, step, metrics=partial(metrics_at, loss_value, model, data))
            if step % train.log_every == 0 or step == train.steps:
                bar.set_postfix(loss=f"{loss_value:.4f}", epoch=epoch)
                log.info("step %d epoch %d loss %.4f lr %.2e", step, epoch, loss_value, lr)
            faults.reach(f"step-{step}")
        ckpt.close()
    except Preempted:
        ckpt.close()
        raise
    finally:
        bar.close()
        guard.uninstall()
        journal.close()
    return 0
