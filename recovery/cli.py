"""``recovery``: the command-line entry point. The only module that prints or exits.

``main(argv) -> int`` parses, runs one subcommand and maps any
:class:`~recovery.errors.RecoveryError` to one message line on stderr and a
distinct exit code per error class (:data:`EXIT_CODES`, listed in README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from recovery import errors, reader, snapshot
from recovery.layout import scan
from recovery.state import MODEL

# Most specific first: the first isinstance match decides the code.
EXIT_CODES: list[tuple[type[BaseException], int, str]] = [
    (errors.CheckpointNotFoundError, 3, "checkpoint not found"),
    (errors.ManifestError, 4, "manifest missing or malformed (uncommitted or damaged)"),
    (errors.UnsafePathError, 5, "unsafe path or symlink"),
    (errors.MissingFileError, 6, "a listed file is missing"),
    (errors.ExtraFileError, 7, "an unlisted file is present"),
    (errors.TruncatedFileError, 8, "a file has the wrong size"),
    (errors.DigestMismatchError, 9, "a file's sha256 does not match"),
    (errors.VerificationError, 15, "verification failed"),
    (errors.FormatError, 10, "verified bytes do not decode"),
    (errors.IncompatibleStateError, 11, "checkpoint does not fit this run"),
    (errors.ConfigError, 12, "invalid configuration"),
    (errors.RunDirInUseError, 13, "fresh run into a run directory with checkpoints"),
    (errors.CommitError, 14, "checkpoint could not be committed"),
    (errors.RecoveryError, 1, "other recovery error"),
]


def exit_code(err: BaseException) -> int:
    """The exit code for an error (1 for anything unlisted)."""
    for cls, code, _ in EXIT_CODES:
        if isinstance(err, cls):
            return code
    return 1


def report(err: BaseException) -> int:
    """Print one line for ``err`` on stderr and return its exit code."""
    print(f"error: {err}", file=sys.stderr)
    return exit_code(err)


def parameters_digest(model_state: dict[str, Any]) -> str:
    """One sha256 over every model tensor: names, dtypes, shapes and raw bytes, by sorted name."""
    h = hashlib.sha256()
    for key in sorted(model_state):
        t = model_state[key]
        if not isinstance(t, torch.Tensor):
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{key}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=1, sort_keys=True) if args.json else text)


def _check(path: Path) -> tuple[reader.Verified, snapshot.Decoded]:
    verified = reader.read_verified(path)
    return verified, snapshot.decode(verified)


def cmd_verify(args: argparse.Namespace) -> int:
    verified, decoded = _check(Path(args.path))
    mf = verified.manifest
    data = {
        "path": str(verified.path),
        "ok": True,
        "step": decoded.step,
        "purpose": mf.recovery.get("purpose"),
        "files": len(mf.files),
        "sha256": mf.root,
    }
    _emit(
        args,
        data,
        f"OK {verified.path}: step {decoded.step}, {len(mf.files)} files verified, "
        f"sha256 {mf.root}",
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    verified, decoded = _check(Path(args.path))
    mf = verified.manifest
    model = decoded.tree.get(MODEL)
    data = {
        "path": str(verified.path),
        "step": decoded.step,
        "purpose": mf.recovery.get("purpose"),
        "run_id": mf.recovery.get("run_id"),
        "components": sorted(decoded.tree),
        "files": [{"name": r.name, "size": r.size, "sha256": r.sha256} for r in mf.files],
        "sha256": mf.root,
        "parameters_sha256": parameters_digest(model) if isinstance(model, dict) else None,
        "metrics": decoded.meta.get("metrics", {}),
        "previous": mf.recovery.get("previous"),
    }
    lines = [
        f"checkpoint  {verified.path}",
        f"step        {decoded.step}",
        f"purpose     {data['purpose']}",
        f"run id      {data['run_id']}",
        f"components  {', '.join(data['components'])}",
        f"parameters  sha256 {data['parameters_sha256']}",
        f"metrics     {json.dumps(data['metrics'], sort_keys=True)}",
        f"sha256      {mf.root}",
        "files:",
        *(f"  {r.name:<24} {r.size:>12}  {r.sha256}" for r in mf.files),
    ]
    _emit(args, data, "\n".join(lines))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise errors.CheckpointNotFoundError(f"{run_dir}: no such run directory", path=run_dir)
    listing = scan(run_dir)
    rows: list[dict[str, Any]] = []
    for step, path in listing.committed:
        row: dict[str, Any] = {"step": step, "path": str(path), "purpose": None, "size": 0}
        try:
            verified, decoded = _check(path)
            row.update(
                purpose=verified.manifest.recovery.get("purpose"),
                size=sum(r.size for r in verified.manifest.files),
                verified=True,
                status="ok",
                loss=decoded.meta.get("metrics", {}).get("loss"),
            )
        except errors.RecoveryError as err:
            row.update(verified=False, status=type(err).__name__, error=str(err))
        rows.append(row)
    for path in listing.stale:
        rows.append({"step": None, "path": str(path), "verified": False, "status": "partial"})
    lines = [f"{'step':>10}  {'purpose':<13} {'size':>12}  {'verified':<8}  status"]
    for r in rows:
        step_txt = str(r["step"]) if r["step"] is not None else "-"
        lines.append(
            f"{step_txt:>10}  {r.get('purpose') or '-':<13} {r.get('size', 0):>12}  "
            f"{'yes' if r['verified'] else 'NO':<8}  {r['status']}  {Path(r['path']).name}"
        )
    _emit(args, {"run_dir": str(run_dir), "checkpoints": rows}, "\n".join(lines))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recovery", description="Verify, inspect and list exact-resume training checkpoints."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("ls", help="table of a run's checkpoints, each verified")
    p.add_argument("run_dir", help="<checkpoint.root>/<run.name>")
    p.set_defaults(func=cmd_ls)
    p = sub.add_parser("verify", help="check every file of a checkpoint against its manifest")
    p.add_argument("path")
    p.set_defaults(func=cmd_verify)
    p = sub.add_parser("inspect", help="step, components, per-file digests, parameter digest")
    p.add_argument("path")
    p.set_defaults(func=cmd_inspect)
    for action in sub.choices.values():
        action.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``recovery`` subcommand; return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except errors.RecoveryError as err:
        return report(err)


def main_entry() -> None:
    """Console-script wrapper around :func:`main`."""
    sys.exit(main())


if __name__ == "__main__":
    main_entry()
