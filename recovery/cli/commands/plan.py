"""``recovery plan``: checkpoint interval arithmetic (Young/Daly), cost against expected loss."""

from __future__ import annotations

import argparse
from typing import Any

from recovery.cli.common import duration, durations, emit
from recovery.run import policy
from recovery.run.tiers import rules


def cmd_plan(args: argparse.Namespace) -> int:
    cost, mtbf, intervals = args.cost, args.mtbf, args.intervals  # parsed by argparse
    best = policy.young_daly(cost, mtbf)
    rows = policy.plan(cost, mtbf, sorted({*intervals, best}), async_save=args.async_save)
    optimum = min(rows, key=lambda r: r["total_per_day_s"])
    for row in rows:
        row["optimum"] = row is optimum
        row["young_daly"] = row["interval_s"] == best
    header = (
        f"checkpoint cost C = {_dur(cost)}, MTBF = {_dur(mtbf)}; "
        f"Young/Daly optimum sqrt(2*C*MTBF) = {_dur(best)}; "
        f"{'async' if args.async_save else 'synchronous'} saves lose at most "
        f"{policy.max_loss_intervals(args.async_save)} interval(s) per failure\n"
        f"{'interval':>10}  {'lost/failure':>12}  {'worst':>8}  {'ckpt cost/day':>13}  "
        f"{'failure loss/day':>16}  {'total/day':>10}"
    )
    lines = [header]
    for r in rows:
        mark = "  <- optimum" if r["optimum"] else ""
        lines.append(
            f"{_dur(r['interval_s']):>10}  {_dur(r['loss_per_failure_s']):>12}  "
            f"{_dur(r['worst_loss_per_failure_s']):>8}  "
            f"{_dur(r['checkpoint_cost_per_day_s']):>13}  {_dur(r['failure_loss_per_day_s']):>16}  "
            f"{_dur(r['total_per_day_s']):>10}{mark}"
        )
    doc: dict[str, Any] = {"cost_s": cost, "mtbf_s": mtbf, "young_daly_s": best, "rows": rows}
    if args.local_cost is not None:
        doc["tiers"] = two = rules.plan(cost, args.local_cost, mtbf, args.host_loss)
        lines += _tiers(two, args.local_cost, args.host_loss)
    emit(args, doc, "\n".join(lines))
    return 0


def _tiers(two: dict[str, float], local_cost: float, host_loss: float) -> list[str]:
    """The one-tier against two-tier lines (:func:`recovery.run.tiers.rules.plan`)."""
    rows = [
        ("interval", "one_tier_interval_s", None),
        ("lost/failure", "one_tier_loss_per_failure_s", "two_tier_loss_per_failure_s"),
        (
            "ckpt cost/day",
            "one_tier_checkpoint_cost_per_day_s",
            "two_tier_checkpoint_cost_per_day_s",
        ),
        ("total/day", "one_tier_total_per_day_s", "two_tier_total_per_day_s"),
    ]
    both = f"local {_dur(two['local_interval_s'])}, persistent {_dur(two['persistent_interval_s'])}"
    lines = [
        "",
        f"two tiers (checkpoint.local): a snapshot costs {_dur(local_cost)}; "
        f"{host_loss:.0%} of failures lose the node (--host-loss) and resume from the "
        "persistent tier, the others from RAM; Young/Daly per tier",
        f"{'':>14}  {'one tier':>10}  two tiers",
    ]
    for label, one, other in rows:
        right = both if other is None else _dur(two[other])
        lines.append(f"{label:>14}  {_dur(two[one]):>10}  {right}")
    lines.append(f"{two['fewer_lost']:.3g}x less work lost per failure with two tiers")
    return lines


def _dur(seconds: float) -> str:
    """``45s``, ``12.5m``, ``3.2h``."""
    if seconds < 120:
        return f"{seconds:.3g}s"
    if seconds < 7200:
        return f"{seconds / 60:.3g}m"
    return f"{seconds / 3600:.3g}h"


def register(sub: Any) -> None:
    """Add ``plan`` to the subcommands."""
    p = sub.add_parser("plan", help="checkpoint interval arithmetic: cost vs expected loss")
    # a bad value is argparse's usage error (exit 2), as for any other bad argument
    p.add_argument(
        "--cost", required=True, type=duration, help="cost of one checkpoint to the run, e.g. 60s"
    )
    p.add_argument(
        "--mtbf", required=True, type=duration, help="mean time between failures, e.g. 24h"
    )
    p.add_argument(
        "--intervals",
        type=durations,
        default="5m,10m,30m,1h,2h,4h,8h",
        help="comma-separated intervals to compare (the optimum is always added)",
    )
    p.add_argument(
        "--async",
        dest="async_save",
        action="store_true",
        help="saves are asynchronous (checkpoint.async=true): one failure may lose two intervals",
    )
    p.add_argument(
        "--local-cost",
        type=duration,
        help="cost of one local-tier snapshot (checkpoint.local), e.g. 2s: also compare one "
        "tier with two",
    )
    p.add_argument(
        "--host-loss",
        type=_share,
        default=0.1,
        help="with --local-cost: the share of failures that lose the node and its RAM "
        "(default 0.1, an assumption: measure yours)",
    )
    p.set_defaults(func=cmd_plan)


def _share(text: str) -> float:
    """``--host-loss``: a share strictly between 0 and 1, for argparse's ``type=``."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(
            f"expected a share between 0 and 1 (e.g. 0.1), got {text!r}"
        )
    return value
