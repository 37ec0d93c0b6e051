"""``recovery drill``: kill-and-resume drill of a training script, or preflight of a checkpoint."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from recovery import errors
from recovery.cli.common import add_trust_flags, compose, emit, trust_of
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

    level = str(OmegaConf.select(cfg, "drill.level", default="bitwise"))
    if level not in ("bitwise", "tolerance"):
        raise errors.ConfigError(f"drill.level: expected bitwise or tolerance, got {level!r}")
    out = Path(args.out or f".recovery/drills/{time.strftime('%Y%m%d-%H%M%S')}")
    plan = drill.Plan(
        script=Path(args.script),
        overrides=[
            o for o in args.overrides if not o.startswith(("checkpoint.root=", "run.name="))
        ],
        steps=int(cfg.train.steps),
        every=int(cfg.checkpoint.every_steps),
        out=out,
        level=level,
        atol=float(OmegaConf.select(cfg, "drill.atol", default=0.0)),
        rtol=float(OmegaConf.select(cfg, "drill.rtol", default=0.0)),
        dvc=args.dvc,
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
        help="drill in a throwaway git+DVC repository, pushing, with kills during registration",
    )
    p.set_defaults(func=cmd_drill)
    add_trust_flags(p)
