"""What every recipe shares: schedules, seeding, the checkpointer's wiring and the loop.

A recipe builds its model, data and :class:`~recovery.state.registry.TrainState`, and a
function that performs one optimizer step; :func:`train` does the rest the
same way for every recipe: journal, preemption guard, checkpointer (signer,
trust, provenance, purposes), restore, the step loop with its per-step record
and checkpoints, and a clean close.
"""

from __future__ import annotations

import dataclasses
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

from recipes import outcome, schedule
from recipes.naming import hydra_overrides, named
from recipes.naming import sweep_job_name as sweep_job_name  # recipes.run cleans its logs
from recipes.outcome import Outcome
from recovery import faults
from recovery.config import (
    CheckpointConfig,
    DistConfig,
    HealthConfig,
    RunConfig,
    SigningConfig,
    TrainConfig,
    typed,
)
from recovery.errors import ConfigError, Preempted
from recovery.format.layout import METRICS_FILE
from recovery.integrity.keys import trust
from recovery.parallel import sharded
from recovery.parallel import world as distributed
from recovery.parallel.world import World
from recovery.provenance import capture as provenance
from recovery.provenance.drift import flatten
from recovery.provenance.purpose import PurposeSpec
from recovery.run import policy, trackers
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal
from recovery.run.monitoring.watch import report
from recovery.run.scheduling.preemption import PreemptionGuard
from recovery.run.trackers import TrackersConfig
from recovery.state.health import HealthMonitor, UpdateProbe
from recovery.state.registry import TrainState
from recovery.state.sampler import batch_digest

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


def join(cfg: DictConfig) -> tuple[World, str]:
    """Join the ``torchrun`` job this process belongs to (if any): its world and strategy.

    Ranks other than 0 log warnings only, so the job's log reads like one process's.
    """
    dc = typed(DistConfig, OmegaConf.select(cfg, "dist", default=None), key="dist")
    world = distributed.setup(dc)
    if not world.leader:
        logging.getLogger().setLevel(logging.WARNING)
    return world, dc.strategy


def parallelize(
    model: torch.nn.Module, world: World, strategy: str, *, parts: list[torch.nn.Module]
) -> torch.nn.Module:
    """The module a step calls: ``model`` itself, DDP around it, or ``model`` sharded in place.

    ``parts`` are the submodules FSDP2 shards as units of their own (the rest
    is sharded with the root). Build the optimizer *after* this: FSDP2
    replaces the parameters with sharded ones.
    """
    if not world.distributed:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for part in parts:
            fully_shard(part)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model)


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
    world: World = distributed.SINGLE,
    strategy: str = "ddp",
) -> Checkpointer:
    """A checkpointer wired to the run's signer, trust store, provenance and purposes."""
    signing_cfg = typed(SigningConfig, cfg.signing, key="signing")
    # the project's dev key, found from the run directory wherever train.py runs from;
    # none anywhere: made in the working directory's project, as the first run always did
    signer = distributed.leader_first(
        partial(trust.resolve_signer, signing_cfg, near=[run_dir], create_in=trust.PROJECT_DEV_KEY)
    )
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
        preemption=preemption if preemption is not None else False,
        health=False,  # the recipes register and feed their own monitor (health_monitor)
        world=world,
        seed=int(cfg.seed),
        strategy=strategy,
    )


def health_monitor(
    cfg: DictConfig, state: TrainState
) -> tuple[HealthMonitor | None, UpdateProbe | None]:
    """The run's health monitor, registered in ``state`` as ``health``, and its update probe.

    ``(None, None)`` with ``health.enabled=false``; no probe without a registered model.
    """
    hc = typed(HealthConfig, OmegaConf.select(cfg, "health", default=None), key="health")
    if not hc.enabled:
        return None, None
    model = state.components.get("model")
    world = distributed.current()
    # a sharded model's probe follows this rank's shard, which another world size does not
    basis = f"sharded:{world.size}:{world.rank}" if sharded.is_sharded(model) else "replicated"
    monitor = HealthMonitor(hc, basis=basis)
    state.add("health", monitor)
    probe = (
        UpdateProbe(model.parameters(), hc.sample) if isinstance(model, torch.nn.Module) else None
    )
    return monitor, probe


def ignored(ckpt: Checkpointer, journal: Journal, fixed: dict[str, str]) -> None:
    """After a resume: say loudly which config changes the checkpoint's state overrides."""
    old = ckpt.identity.old_config
    if old is None or ckpt.resumed_from is None:
        return
    lines = policy.ignored_on_resume(flatten(old), flatten(ckpt.config), fixed)
    for line in lines:
        log.warning("OVERRIDE IGNORED: %s", line)
    if lines:
        journal.write({"event": "override_ignored", "lines": lines})


def train(
    cfg: DictConfig,
    state: TrainState,
    one_step: Callable[[], StepResult],
    *,
    metrics: Callable[[float], dict[str, float]],
    data_root: Path,
    model_cfg: dict[str, object],
    examples: int,
    best_metric: str,
    fixed_on_resume: dict[str, str],
    world: World = distributed.SINGLE,
    strategy: str = "ddp",
) -> Outcome:
    """Restore ``state`` as ``cfg`` asks, run ``one_step`` to ``train.steps``, checkpoint;
    return exit code 0 and how the run went (logged too: a sweep's summary shows it).

    Args:
        cfg: the composed config.
        state: the run's complete training state.
        one_step: performs one optimizer step.
        metrics: the loss of the step -> the metrics a checkpoint records (called
            only when a checkpoint is written).
        data_root: the dataset the run reads (its version goes into provenance).
        model_cfg: what rebuilds the model (for warm starts).
        examples: the dataset's size, for the log.
        best_metric: the metric ``checkpoint.keep_best`` ranks by, unless the config names one.
        fixed_on_resume: config keys (or prefixes ending in ``.``) a resume restores from
            the checkpoint, whatever the command line says -> what restores them; a
            change to one is warned about loudly (``OVERRIDE IGNORED``) and journaled.
        world: this rank and the job's size (:func:`join`); rank 0 alone journals.
        strategy: the job's parallelism, recorded in its checkpoints.
    """
    if distributed.launched() and not world.distributed:
        raise ConfigError(
            f"recipe {OmegaConf.select(cfg, 'recipe.name')}: does not run under torchrun yet; "
            "start it with python, or use recipe=embedding"
        )
    ck = typed(CheckpointConfig, cfg.checkpoint, key="checkpoint")
    if ck.best_metric is None:
        ck = dataclasses.replace(ck, best_metric=best_metric)
    run_cfg = named(cfg, typed(RunConfig, cfg.run, key="run"), ck)
    steps = typed(TrainConfig, cfg.train, key="train")
    run_dir = Path(ck.root) / sweep_job_name(run_cfg.name, cfg)
    journal = Journal(run_dir / METRICS_FILE if world.leader else None)
    tracked = typed(TrackersConfig, OmegaConf.select(cfg, "trackers", default=None), key="trackers")
    # before restore: they see the resume; named by the whole run name (a sweep job's too)
    trackers.attach(journal, tracked, run_dir=run_dir, run_name=sweep_job_name(run_cfg.name, cfg))
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
        world=world,
        strategy=strategy,
    )
    monitor, probe = health_monitor(cfg, state)
    step = ckpt.restore(
        state,
        OmegaConf.select(cfg, "resume", default=None),
        init_from=OmegaConf.select(cfg, "init_from", default=None),
    )
    ignored(ckpt, journal, fixed_on_resume)
    if world.leader and (
        note := schedule.change(
            ckpt.identity.drift,
            state.components.get("scheduler"),
            state.components.get("optimizer"),
            step,
        )
    ):
        log.warning("%s", note)
    log.info("run %s: step %d of %d, %d examples", run_dir, step, steps.steps, examples)
    began = step
    # a progress bar on a terminal; plain log lines (below) everywhere else
    bar = tqdm(
        total=steps.steps,
        initial=step,
        unit="step",
        disable=not (sys.stderr.isatty() and world.leader),
    )
    guard.install()
    try:  # the journal closed and the guard uninstalled before the job may requeue
        try:
            while step < steps.steps:
                if probe is not None:
                    probe.before()
                result = one_step()
                step += 1
                update = probe.after() if probe is not None else None
                journal.write(
                    {
                        "step": step,
                        "epoch": result.epoch,
                        "loss": result.loss,
                        "lr": result.lr,
                        "batch": batch_digest(result.batch),
                        **({"update": update} if update is not None else {}),
                    }
                )
                bar.update(1)
                if monitor is not None:
                    report(
                        journal,
                        step,
                        monitor.observe(step, loss=result.loss, lr=result.lr, update=update),
                    )
                ckpt.maybe_save(state, step, metrics=partial(metrics, result.loss))
                if step % steps.log_every == 0 or step == steps.steps:
                    bar.set_postfix(loss=f"{result.loss:.4f}", epoch=result.epoch)
                    log.info(
                        "step %d epoch %d loss %.4f lr %.2e",
                        *(step, result.epoch, result.loss, result.lr),
                    )
                faults.reach(f"step-{step}")
            if monitor is not None:
                report(journal, step, monitor.finish())
            ckpt.close()
        except Preempted:
            ckpt.close()
            raise
        finally:
            bar.close()
            guard.uninstall()
            journal.close()
    except Preempted as err:
        ckpt.requeue_after(err)
        raise
    how = outcome.said(
        run_dir,
        started=began,
        ended=step,
        final=steps.steps,
        resumed=ckpt.resumed_from is not None,
        warm=OmegaConf.select(cfg, "init_from", default=None) is not None,
    )
    if world.leader:
        log.info("%s", how)
    return Outcome(0, how)
