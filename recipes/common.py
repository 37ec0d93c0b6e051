"""What every recipe shares: schedules, seeding, the checkpointer's wiring and the loop.

A recipe builds its model, data and :class:`~recovery.state.TrainState`, and a
function that performs one optimizer step; :func:`train` does the rest the
same way for every recipe: journal, preemption guard, checkpointer (signer,
trust, provenance, purposes), restore, the step loop with its per-step record
and checkpoints, and a clean close.
"""

from __future__ import annotations

import logging
import math
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from recovery import faults, provenance, trust
from recovery.checkpointer import Checkpointer
from recovery.config import CheckpointConfig, RunConfig, SigningConfig, TrainConfig, typed
from recovery.errors import Preempted
from recovery.journal import Journal
from recovery.layout import METRICS_FILE
from recovery.preemption import PreemptionGuard
from recovery.purpose import PurposeSpec
from recovery.state import TrainState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step reports for the per-step record."""

    epoch: int
    batch: list[int]
    loss: float
    lr: float


def warmup_cosine(warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
    """LR factor at a step: linear warmup to 1, then cosine down to ``min_ratio`` at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def seed_everything(seed: int) -> None:
    """Seed every stream a fresh run draws from (a resume overwrites them from the checkpoint)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


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


def train(
    cfg: DictConfig,
    state: TrainState,
    one_step: Callable[[], StepResult],
    *,
    metrics: Callable[[float], dict[str, float]],
    data_root: Path,
    model_cfg: dict[str, object],
    examples: int,
) -> int:
    """Restore ``state`` as ``cfg`` asks, run ``one_step`` to ``train.steps``, checkpoint; return 0.

    Args:
        cfg: the composed config.
        state: the run's complete training state.
        one_step: performs one optimizer step.
        metrics: the loss of the step -> the metrics a checkpoint records (called
            only when a checkpoint is written).
        data_root: the dataset the run reads (its version goes into provenance).
        model_cfg: what rebuilds the model (for warm starts).
        examples: the dataset's size, for the log.
    """
    ck = typed(CheckpointConfig, cfg.checkpoint, key="checkpoint")
    run_cfg = typed(RunConfig, cfg.run, key="run")
    steps = typed(TrainConfig, cfg.train, key="train")
    run_dir = Path(ck.root) / run_cfg.name
    journal = Journal(run_dir / METRICS_FILE)
    guard = PreemptionGuard(ck.preempt_signals)
    ckpt = make_checkpointer(
        cfg,
        ck,
        run_dir,
        final_step=steps.steps,
        data_root=data_root,
        model_cfg=model_cfg,
        journal=journal,
        preemption=guard,
    )
    step = ckpt.restore(
        state,
        OmegaConf.select(cfg, "resume", default=None),
        init_from=OmegaConf.select(cfg, "init_from", default=None),
    )
    log.info("run %s: step %d of %d, %d examples", run_dir, step, steps.steps, examples)
    # a progress bar on a terminal; plain log lines (below) everywhere else
    bar = tqdm(total=steps.steps, initial=step, unit="step", disable=not sys.stderr.isatty())
    guard.install()
    try:
        while step < steps.steps:
            result = one_step()
            step += 1
            journal.write(
                {
                    "step": step,
                    "epoch": result.epoch,
                    "loss": result.loss,
                    "lr": result.lr,
                    "batch": result.batch,
                }
            )
            bar.update(1)
            ckpt.maybe_save(state, step, metrics=partial(metrics, result.loss))
            if step % steps.log_every == 0 or step == steps.steps:
                bar.set_postfix(loss=f"{result.loss:.4f}", epoch=result.epoch)
                log.info(
                    "step %d epoch %d loss %.4f lr %.2e", step, result.epoch, result.loss, result.lr
                )
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
