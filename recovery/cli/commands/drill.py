"""``recovery drill``: kill-and-resume drill of the project's ``train.py`` (Hydra overrides)
or of any command (``-- CMD ... {run_dir} ...``), or preflight of a checkpoint.

The positionals are a command, not overrides, when one holds ``{run_dir}`` or the first
is no Hydra override (``key=value``, ``+key=value``, ``~key``): argparse drops the
``--`` that separates them, and an executable's name is never ``key=value``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recovery import errors
from recovery.cli.codes import error_json, of_error
from recovery.cli.codes import report as report_error
from recovery.cli.common import add_trust_flags, duration, emit, trust_of
from recovery.progress import event_lines

if TYPE_CHECKING:  # torch comes with these: imported when a drill runs, not for --help
    from recovery.tools.drill.verdict import Report

_OVERRIDE = re.compile(r"^(~|\+{0,2}[\w.@/\[\]-]+=)")
USAGE = 2
"""Exit code of a bad command line (README's table), as argparse's own refusals."""
RUN_DIR = "{run_dir}"
"""A drilled command's run directory (:data:`recovery.tools.drill.command.RUN_DIR`)."""
KILLS = 8
"""The default ``--kills``: with the drill's short run, about two minutes on two cores."""


def __getattr__(name: str) -> Any:
    """``drill_command`` (:mod:`recovery.tools.drill.command`), imported on first use: a
    module attribute as before the drill was imported lazily, for code that patches it."""
    if name == "drill_command":
        from recovery.tools.drill import command

        return command
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def command_of(positionals: list[str]) -> list[str] | None:
    """The drilled command, if the positionals are one (see the module); else ``None``."""
    if not positionals:
        return None
    if any(RUN_DIR in p for p in positionals) or not _OVERRIDE.match(positionals[0]):
        return positionals
    return None


def _usage(args: argparse.Namespace, message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    if args.json:  # a failure under --json is JSON on stdout too
        print(json.dumps(error_json(USAGE, "usage", message), indent=1, sort_keys=True))
    return USAGE


def _page(out: Path, report: Report) -> str | None:
    """Write ``drill.html`` beside ``drill.png`` (none without matplotlib, as the plot)."""
    if report.plot is None:
        return None
    from recovery.tools.report import drill as report_drill

    try:
        return str(report_drill.write(out, report))
    except errors.ConfigError:  # the verdict stands without its page
        return None


def _verdict(args: argparse.Namespace, report: Report, what: str, out: Path) -> int:
    """Print the report (text or ``--json``); a failed drill is a DrillError (exit 23):
    raised, or with ``--json`` in the report (its ``error``) and its line on stderr."""
    from recovery.tools.drill.verdict import DRILL_FILE

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
        f"report {out / DRILL_FILE}, plot {report.plot or 'none (needs recovery[plot])'}, "
        f"page {page or 'none'}, {report.seconds:.0f}s",
    ]
    data = {**report.__dict__, "out": str(out), "page": page}
    if report.passed:
        emit(args, data, "\n".join(lines))
        return 0
    failed = errors.DrillError(
        f"drill failed: {len(report.differences)} differences, first: {report.differences[0]}"
    )
    if not args.json:
        emit(args, data, "\n".join(lines))
        raise failed
    # one JSON document on stdout: the report with its error, not the report and then
    # the error object that main would print for a raised one
    emit(args, {**data, **of_error(failed)}, "")
    return report_error(failed)


def _drilled(args: argparse.Namespace, run: Callable[..., Report], plan: Any) -> Report:
    """``run(plan)`` (either drill) with the flags, each run and kill told on stderr as it
    ends: lines above a bar on a terminal, plain lines otherwise (stdout stays the report)."""
    with event_lines(args.kills + 2, "drill") as lines:
        return run(
            plan,
            kills=args.kills,
            seed=args.seed,
            trust=lambda: trust_of(args),
            allow_untrusted=args.allow_untrusted,
            say=lines.say,
        )


def _drill_command(args: argparse.Namespace, command: list[str]) -> int:
    """``recovery drill -- CMD ...``: usage errors are one line and exit 2."""
    from recovery.tools.drill import command as drill_command

    try:
        drill_command.check_command(command)
    except errors.ConfigError as err:  # to drill train.py instead, overrides are key=value
        return _usage(args, f"{err} (or Hydra overrides key=value, to drill train.py)")
    if args.dvc or args.script:
        flag = "--dvc" if args.dvc else "--script"
        return _usage(args, f"drill {flag}: only for the project's train.py, not with a command")
    out = Path(args.out or f".recovery/drills/{time.strftime('%Y%m%d-%H%M%S')}")
    plan = drill_command.CommandPlan(command=command, out=out, timeout_s=args.timeout)
    report = _drilled(args, drill_command.run, plan)
    return _verdict(args, report, shlex.join(command), out)


def cmd_drill(args: argparse.Namespace) -> int:
    if args.kills < 1 and not args.preflight:  # a drill that kills nothing proves nothing
        raise errors.ConfigError(
            f"drill --kills: expected a whole number of kills >= 1, got {args.kills}; "
            f"set e.g. --kills {KILLS}"
        )
    from recovery.tools import drill

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
    from recovery.cli.overrides import compose
    from recovery.config import CheckpointConfig, DrillConfig, TrainConfig, typed

    overrides = drill.short_run(list(args.overrides))
    cfg = compose("drill", overrides)  # first: without Hydra, the one line naming the extra
    from omegaconf import OmegaConf

    judged = typed(DrillConfig, OmegaConf.select(cfg, "drill", default=None), key="drill")
    ck = typed(CheckpointConfig, cfg.checkpoint, key="checkpoint")
    out = Path(args.out or f".recovery/drills/{time.strftime('%Y%m%d-%H%M%S')}")
    script = args.script or "train.py"
    plan = drill.Plan(
        script=Path(script),
        overrides=[o for o in overrides if not o.startswith(("checkpoint.root=", "run.name="))],
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
        chained=ck.differential.against == "previous",
        timeout_s=args.timeout,
    )
    report = _drilled(args, drill.run, plan)
    return _verdict(args, report, f"{script} {' '.join(overrides)}", out)


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
        help="Hydra overrides for the drilled train.py run (without train.steps or "
        "checkpoint.every_steps among them it is the short run train.steps=120 "
        "checkpoint.every_steps=20); or, after --, a command whose arguments name its run "
        "directory {run_dir} (it must restore 'latest' itself)",
    )
    p.add_argument(
        "--kills",
        type=int,
        default=KILLS,
        help=f"SIGKILLs at random points (default {KILLS}; a thorough drill: --kills 20 "
        "train.steps=1200 checkpoint.every_steps=200)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed for choosing the kill points (default 0)"
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="where the runs, drill.json, drill.png and drill.html go "
        "(default .recovery/drills/<date-time>)",
    )
    p.add_argument(
        "--script",
        metavar="PATH",
        help="the Hydra training script to drill, composed from this project's conf/ "
        "(default train.py)",
    )
    p.add_argument(
        "--timeout",
        type=duration,
        default="30m",
        help="the longest one run of the drilled program may take (default 30m; e.g. 90s)",
    )
    p.add_argument(
        "--preflight",
        metavar="PATH",
        help="instead of a drill: restore one real checkpoint's data cursor and optimizer "
        "and check they reproduce the step, learning rate and next batch it recorded",
    )
    p.add_argument(
        "--dvc",
        action="store_true",
        help="drill in a throwaway git+DVC repository, pushing, one kill on its publisher",
    )
    p.set_defaults(func=cmd_drill)
    add_trust_flags(p)
