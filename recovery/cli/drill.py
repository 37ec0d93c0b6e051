"""``recovery drill``: kill-and-resume drill of the project's ``train.py`` (Hydra overrides)
or of any command (``-- CMD ... {run_dir} ...``), or preflight of a checkpoint.

The positionals are a command, not overrides, when one holds ``{run_dir}`` or the first
is no Hydra override (``key=value``, ``+key=value``, ``~key``): argparse drops the
``--`` that separates them, and an executable's name is never ``key=value``.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from recovery import errors
from recovery.cli.common import add_trust_flags, duration, emit, trust_of
from recovery.cli.overrides import compose
from recovery.config import CheckpointConfig, DrillConfig, TrainConfig, typed
from recovery.tools import drill
from recovery.tools.drill import command as drill_command
from recovery.tools.drill.verdict import Report
from recovery.tools.report import drill as report_drill

_OVERRIDE = re.compile(r"^(~|\+{0,2}[\w.@/\[\]-]+=)")
USAGE = 2
"""Exit code of a bad command line (README's table), as argparse's own refusals."""


def command_of(positionals: list[str]) -> list[str] | None:
    """The drilled command, if the positionals are one (see the module); else ``None``."""
    if not positionals:
        return None
    if any(drill_command.RUN_DIR in p for p in positionals) or not _OVERRIDE.match(positionals[0]):
        return positionals
    return None


def _usage(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return USAGE


def _page(out: Path, report: Report) -> str | None:
    """Write ``drill.html`` beside ``drill.png`` (none without matplotlib, as the plot)."""
    if report.plot is None:
        return None
    try:
        return str(report_drill.write(out, report))
    except errors.ConfigError:  # the verdict stands without its page
        return None


def _verdict(args: argparse.Namespace, report: Report, what: str, out: Path) -> int:
    """Print the report (text or ``--json``); a failed drill is a DrillError (exit 23)."""
    page = _page(out, report)
    reached = sum(k["reached"] for k in report.kills)
    lines = [
        f"drill of {what}: {reached} kills "
        f"({', '.join(k['point'] for k in report.kills)}), resumed at {report.resumes}",
        f"level {report.level}: "
        + (
            "PASS: the drilled run equals the uninterrupted run"
            if report.passed
            else f"FAIL: {len(report.differences)} differences"
        ),
        *(f"  {d}" for d in report.differences[:20]),
        f"report {out / drill.DRILL_FILE}, plot {report.plot or 'none (needs recovery[plot])'}, "
        f"page {page or 'none'}, {report.seconds:.0f}s",
    ]
    emit(args, {**report.__dict__, "out": str(out), "page": page}, "\n".join(lines))
    if not report.passed:
        raise errors.DrillError(
            f"drill failed: {len(report.differences)} differences, first: {report.differences[0]}"
        )
    return 0


def _drill_command(args: argparse.Namespace, command: list[str]) -> int:
    """``recovery drill -- CMD ...``: usage errors are one line and exit 2."""
    try:
        drill_command.check_command(command)
    except errors.ConfigError as err:  # to drill train.py instead, overrides are key=value
        return _usage(f"{err} (or Hydra overrides key=value, to drill train.py)")
    if args.dvc or args.script:
        flag = "--dvc" if args.dvc else "--script"
        return _usage(f"drill {flag}: only for the project's train.py, not with a command")
    out = Path(args.out or f".recovery/drills/{time.strftime('%Y%m%d-%H%M%S')}")
    plan = drill_command.CommandPlan(command=command, out=out, timeout_s=args.timeout)
    report = drill_command.run(
        plan,
        kills=args.kills,
        seed=args.seed,
        trust=lambda: trust_of(args),
        allow_untrusted=args.allow_untrusted,
    )
    return _verdict(args, report, shlex.join(command), out)


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
    command = command_of(list(args.overrides))
    if command is not None:
        return _drill_command(args, command)
    cfg = compose("drill", list(args.overrides))
    from omegaconf import OmegaConf

    judged = typed(DrillConfig, OmegaConf.select(cfg, "drill", default=None), key="drill")
    ck = typed(CheckpointConfig, cfg.checkpoint, key="checkpoint")
    out = Path(args.out or f".recovery/drills/{time.strftime('%Y%m%d-%H%M%S')}")
    script = args.script or "train.py"
    plan = drill.Plan(
        script=Path(script),
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
        full_every=ck.differential.full_every if ck.differential.enabled else 0,
        timeout_s=args.timeout,
    )
    report = drill.run(
        plan,
        kills=args.kills,
        seed=args.seed,
        trust=lambda: trust_of(args),
        allow_untrusted=args.allow_untrusted,
    )
    return _verdict(args, report, f"{script} {' '.join(args.overrides)}", out)


def register(sub: Any) -> None:
    """Add ``drill`` to the subcommands."""
    p = sub.add_parser(
        "drill",
        help="kill-and-resume drill of train.py, or of any command (-- CMD ... {run_dir} ...), "
        "or --preflight PATH",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help="Hydra overrides for the drilled train.py run; or, after --, a command whose "
        "arguments name its run directory {run_dir} (it must restore 'latest' itself)",
    )
    p.add_argument("--kills", type=int, default=10, help="SIGKILLs at random points (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed for choosing the kill points")
    p.add_argument("--out", help="where the runs, drill.json and drill.png go")
    p.add_argument("--script", help="the Hydra training script (default train.py)")
    p.add_argument(
        "--timeout",
        type=duration,
        default="30m",
        help="the longest one run of the drilled program may take (default 30m; e.g. 90s)",
    )
    p.add_argument("--preflight", metavar="PATH", help="check one real checkpoint instead")
    p.add_argument(
        "--dvc",
        action="store_true",
        help="drill in a throwaway git+DVC repository, pushing, one kill on its publisher",
    )
    p.set_defaults(func=cmd_drill)
    add_trust_flags(p)
