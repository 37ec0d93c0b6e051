"""``recovery drill``: kill-and-resume drill of a training script, or preflight of a checkpoint."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from recovery import errors
from recovery.cli.common import add_trust_flags, emit, trust_of
from recovery.cli.overrides import compose
from recovery.config import CheckpointConfig, DrillConfig, TrainConfig, typed
from recovery.tools import drill


def cmd_drill(args: argparse.Namespace) -> int:
    if args.preflight:
        result = drill.preflight(Path(args.preflight), trust_of(args))
        emit(
            args,
            result,
            f"preflight OK {result['path']}: step {result['step']}, lr {result['lr']}, "
            f"next batch of {result['next_batch_size']} reproduced",
        )
        return 0
    cfg = compose("drill", list(args.overrides))
    from omegaconf import OmegaConf

    judged = typed(DrillConfig, OmegaConf.select(cfg, "drill", default=None), key="drill")
    ck = typed(CheckpointConfig, cfg.checkpoint, key="checkpoint")
    out = Path(args.out or f".recovery/drills/{time.strftime('%Y%m%d-%H%M%S')}")
    plan = drill.Plan(
        script=Path(args.script),
        overrides=[
            o for o in args.overrides if not o.startswith(("checkpoint.root=", "run.name="))
        ],
        steps=typed(TrainConfig, cfg.train, key="train").steps,
        every=ck.every_steps,
        out=out,
        level=judged.level,
        atol=judged.atol,
        rtol=judged.rtol,
        dvc=args.dvc,
        keep_last=ck.keep_last,
        keep_every=ck.keep_every,
        keep_best=ck.keep_best,
    )
    report = drill.run(
        plan,
        kills=args.kills,
        seed=args.seed,
        trust=lambda: trust_of(args),
        allow_untrusted=args.allow_untrusted,
    )
    reached = sum(k["reached"] for k in report.kills)
    lines = [
        f"drill of {args.script} {' '.join(args.overrides)}: {reached} kills "
        f"({', '.join(k['point'] for k in report.kills)}), resumed at {report.resumes}",
        f"level {report.level}: "
        + (
            "PASS: the drilled run equals the uninterrupted run"
            if report.passed
            else f"FAIL: {len(report.differences)} differences"
        ),
        *(f"  {d}" for d in report.differences[:20]),
        f"report {out / drill.DRILL_FILE}, plot {report.plot or 'none (needs recovery[plot])'}, "
        f"{report.seconds:.0f}s",
    ]
    emit(args, {**report.__dict__, "out": str(out)}, "\n".join(lines))
    if not report.passed:
        raise errors.DrillError(
            f"drill failed: {len(report.differences)} differences, first: {report.differences[0]}"
        )
    return 0


def register(sub: Any) -> None:
    """Add ``drill`` to the subcommands."""
    p = sub.add_parser("drill", help="kill-and-resume drill (or --preflight PATH)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for the drilled training run")
    p.add_argument("--kills", type=int, default=10, help="SIGKILLs at random points (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed for choosing the kill points")
    p.add_argument("--out", help="where the runs, drill.json and drill.png go")
    p.add_argument("--script", default="train.py", help="the training script (default train.py)")
    p.add_argument("--preflight", metavar="PATH", help="check one real checkpoint instead")
    p.add_argument(
        "--dvc",
        action="store_true",
        help="drill in a throwaway git+DVC repository, pushing, one kill on its publisher",
    )
    p.set_defaults(func=cmd_drill)
    add_trust_flags(p)
