"""``recovery sync``: register (and push) with DVC every checkpoint it has not got yet."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from recovery import errors
from recovery.cli.common import duration, emit, phase
from recovery.format.layout import scan
from recovery.storage import gitignored, tracking


def cmd_sync(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise errors.CheckpointNotFoundError(f"{run_dir}: no such run directory", path=run_dir)
    root = tracking.find_repo(run_dir)
    if root is None or not run_dir.is_dir():
        raise errors.TrackingError(
            f"{run_dir}: not a run directory inside a DVC repository (run `dvc init` at the "
            "project root)",
            path=run_dir,
        )
    if why := gitignored.git_ignored(root, run_dir):
        raise errors.TrackingError(gitignored.not_registered(run_dir, why), path=run_dir)
    state = tracking.status(run_dir)
    todo = [
        path
        for _, path in scan(run_dir).committed
        if (
            not state.get(path.name, tracking.Status()).registered
            or (args.push and not state.get(path.name, tracking.Status()).pushed)
        )
        and not tracking.local_snapshot(path)  # a local-tier snapshot is never pushed
    ]
    if todo:
        doing = "registering and pushing" if args.push else "registering"
        to = f" to remote {args.remote}" if args.remote else ""
        phase("sync", f"{doing} {len(todo)} checkpoint(s) with DVC{to} (waits up to "
              f"{args.timeout:.0f} s)")  # fmt: skip
    publisher = tracking.Publisher(root, push=args.push, remote=args.remote)
    for path in todo:
        publisher.submit(path)
    done = publisher.close(args.timeout)
    after = tracking.status(run_dir)
    left = [
        p.name
        for p in todo
        if not after.get(p.name, tracking.Status()).registered
        or (args.push and not after.get(p.name, tracking.Status()).pushed)
    ]
    data = {
        "run_dir": str(run_dir),
        "synced": [p.name for p in todo if p.name not in left],
        "pending": left,
    }
    emit(
        args,
        data,
        f"synced {len(data['synced'])}, still pending {len(left)}"
        + (f": {', '.join(left)}" if left else ""),
    )
    if left or not done:
        causes = sorted({publisher.errors[p] for p in todo if p in publisher.errors})
        if not done:
            causes.append(f"DVC did not finish within {args.timeout:.0f} s (--timeout)")
        cause = "; ".join(causes) or (
            "not registered: removed meanwhile, or run inside a DVC stage (DVC_STAGE set), "
            "where nothing is added"
        )
        raise errors.TrackingError(
            f"{run_dir}: {len(left)} checkpoint(s) still pending ({', '.join(left)}): {cause}",
            path=run_dir,
        )
    return 0


def register(sub: Any) -> None:
    """Add ``sync`` to the subcommands."""
    p = sub.add_parser("sync", help="register (and push) every checkpoint DVC has not got yet")
    p.add_argument("run_dir", help="<checkpoint.root>/<run.name>")
    p.add_argument("--push", action="store_true", help="also push to the remote")
    p.add_argument("--remote", default=None, help="DVC remote name (default: the default remote)")
    p.add_argument(
        "--timeout", type=duration, default="10m", help="give up after this long (e.g. 90s, 10m)"
    )
    p.set_defaults(func=cmd_sync)
