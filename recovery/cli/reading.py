"""The reading commands: ``ls``, ``verify``, ``inspect``, ``audit``. They never write.

Each verifies before it shows anything: a listing row, an inspection or an
audit link is what the verified bytes say, never what a file claims.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from recovery import errors
from recovery.cli.codes import EXIT_CODES, exit_code
from recovery.cli.common import (
    add_trust_flags,
    emit,
    load,
    parameters_digest,
    signer_of,
    signer_text,
    trust_of,
)
from recovery.format.layout import scan
from recovery.run import resume
from recovery.state.registry import MODEL
from recovery.storage import tracking
from recovery.tools import audit


def cmd_verify(args: argparse.Namespace) -> int:
    loaded = load(args, Path(args.path))
    mf = loaded.manifest
    data: dict[str, Any] = {
        "path": str(loaded.path),
        "ok": True,
        "step": loaded.decoded.step,
        "purpose": mf.purpose,
        "components": loaded.components,
        "files": len(mf.files),
        "sha256": mf.root,
        "signer": signer_of(loaded),
    }
    emit(
        args,
        data,
        f"OK {loaded.path}: step {loaded.decoded.step}, purpose {mf.purpose}, "
        f"{len(mf.files)} files verified, signed by {signer_text(data['signer'])}, "
        f"sha256 {mf.root}",
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    loaded = load(args, Path(args.path))
    mf, decoded = loaded.manifest, loaded.decoded
    rec = mf.recovery
    model = decoded.tree.get(MODEL)
    prov = rec.get("provenance", {})
    data = {
        "path": str(loaded.path),
        "step": decoded.step,
        "purpose": mf.purpose,
        "run_id": rec.get("run_id"),
        "components": loaded.components,
        "files": [{"name": r.name, "size": r.size, "sha256": r.sha256} for r in mf.files],
        "sha256": mf.root,
        "parameters_sha256": parameters_digest(model) if isinstance(model, dict) else None,
        "metrics": decoded.meta.get("metrics", {}),
        "signer": signer_of(loaded),
        "previous": rec.get("previous"),
        "parent": rec.get("parent"),
        "code": prov.get("code"),
        "dataset": prov.get("dataset"),
        "config_sha256": prov.get("config", {}).get("sha256"),
    }
    code = prov.get("code") or {}
    lines = [
        f"checkpoint  {loaded.path}",
        f"step        {decoded.step}",
        f"purpose     {mf.purpose}",
        f"run id      {data['run_id']}",
        f"signer      {signer_text(data['signer'])}",
        f"components  {', '.join(loaded.components)}",
        f"parameters  sha256 {data['parameters_sha256']}",
        f"metrics     {json.dumps(data['metrics'], sort_keys=True)}",
        f"code        {code.get('commit') or code.get('reason')}"
        + (" (dirty)" if code.get("dirty") else ""),
        f"dataset     {(prov.get('dataset') or {}).get('version')}",
        f"sha256      {mf.root}",
        "files:",
        *(f"  {r.name:<24} {r.size:>12}  {r.sha256}" for r in mf.files),
    ]
    emit(args, data, "\n".join(lines))
    return 0


def human_size(n: int) -> str:
    """``512 B``, ``12.3 MiB``: bytes in binary units (up to TiB), one decimal."""
    power = min(4, max(0, (n.bit_length() - 1) // 10))  # the largest 1024**power <= n
    return f"{n} B" if power == 0 else f"{n / 1024**power:.1f} {'BKMGT'[power]}iB"


# what each failure reads as in the status column (a class not here: its exit-code text)
VERDICTS: dict[type[errors.RecoveryError], str] = {
    errors.UntrustedSignerError: "UNTRUSTED key {key}",
    errors.ForeignCheckpointError: "FOREIGN: written by run {run}",
    errors.DigestMismatchError: "DAMAGED: sha256 mismatch in {file}",
    errors.TruncatedFileError: "DAMAGED: wrong size of {file}",
    errors.MissingFileError: "DAMAGED: {file} missing",
    errors.ExtraFileError: "DAMAGED: unlisted {file}",
    errors.UnsafePathError: "UNSAFE: symlink or escaping path {file}",
    errors.ManifestError: "DAMAGED: manifest missing or malformed ({file})",
    errors.SignatureError: "BAD SIGNATURE: {file}",
    errors.FormatError: "UNDECODABLE: {file}",
    errors.PurposeError: "INCOMPLETE: lacks what its purpose requires",
}


def verdict(err: errors.RecoveryError, ckpt: Path) -> str:
    """The status column of a checkpoint that failed: what failed, and in which file."""
    file = err.path if err.path is not None and err.path != ckpt else Path(ckpt.name)
    if file.is_relative_to(ckpt):
        file = file.relative_to(ckpt)
    for cls in type(err).__mro__:
        if cls in VERDICTS:
            key, run = getattr(err, "key_id", "")[:12], getattr(err, "run_id", "")[:8]
            return VERDICTS[cls].format(file=file.as_posix(), key=key, run=run)
    return "FAILED: " + next(what for cls, _, what in EXIT_CODES if isinstance(err, cls))


def ls_row(path: Path, args: argparse.Namespace, trust: Any) -> dict[str, Any]:
    """One committed checkpoint, verified; a failure's error is kept under ``exception``."""
    row: dict[str, Any] = {"path": str(path), "purpose": None, "size": 0}
    try:
        loaded = resume.load(path, trust, allow_untrusted=args.allow_untrusted)
    except errors.RecoveryError as err:
        # status stays the class name (what scripts match on); summary is the table's text
        row.update(verified=False, status=type(err).__name__, summary=verdict(err, path))
        row.update(error=str(err), exit_code=exit_code(err), exception=err)
        if isinstance(err, errors.UntrustedSignerError):
            row["key_id"] = err.key_id
        return row
    metrics = loaded.decoded.meta.get("metrics", {})
    row.update(purpose=loaded.manifest.purpose, verified=True, status="ok", summary="ok")
    row.update(size=sum(r.size for r in loaded.manifest.files), loss=metrics.get("loss"))
    row["signer"] = signer_of(loaded)
    return row


def columns(table: list[list[str]], right: tuple[int, ...]) -> str:
    """Each column padded to its widest cell (``right`` ones right-aligned), the last as is."""
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    pad = [str.rjust if i in right else str.ljust for i in range(len(widths))]
    return "\n".join(
        "  ".join([*(pad[i](c, widths[i]) for i, c in enumerate(line[:-1])), line[-1]])
        for line in table
    )


def cmd_ls(args: argparse.Namespace) -> int:
    """List a run's checkpoints, each verified; exit with the first failure's code.

    A partial write (an uncommitted temp directory) and a ``remote-only``
    checkpoint (a ``.dvc`` file whose directory is not here) are listed, not
    failures. The DVC column is shown only when the run directory is in a DVC
    repository or holds DVC files or tracking records (``--json`` always has it).
    """
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise errors.CheckpointNotFoundError(f"{run_dir}: no such run directory", path=run_dir)
    listing, trust = scan(run_dir), trust_of(args)
    dvc_state, tracked = tracking.status(run_dir), tracking.tracked_steps(run_dir)
    in_repo = tracking.find_repo(run_dir) is not None
    dvc_on = in_repo or bool(dvc_state) or bool(tracked)
    rows: list[dict[str, Any]] = []
    pending = "pending" if in_repo else "-"
    for step, path in listing.committed:
        st = dvc_state.get(path.name, tracking.Status())
        dvc = "pushed" if st.pushed else "registered" if st.registered else pending
        rows.append({"step": step, **ls_row(path, args, trust), "dvc": dvc})
    partial = {"verified": False, "status": "partial", "summary": "partial: interrupted, unused"}
    rows += [{"step": None, "path": str(path), **partial} for path in listing.stale]
    remote = {"verified": False, "status": "remote-only", "dvc": "registered"}
    remote["summary"] = "remote-only: not on disk; `dvc pull` fetches it"
    on_disk = {step for step, _ in listing.committed}
    rows += [
        {"step": step, "path": str(path), **remote}
        for step, path in sorted(tracked.items())
        if step not in on_disk
    ]
    failed = [row.pop("exception") for row in rows if "exception" in row]
    head = ["step", "name", "purpose", "size", "verified", "signer", "dvc", "status"]
    table = [head] + [
        [
            "-" if r["step"] is None else str(r["step"]),
            Path(r["path"]).name,
            r.get("purpose") or "-",
            human_size(r["size"]) if r["verified"] else "-",
            "yes" if r["verified"] else "NO",
            signer_text(r["signer"]) if r.get("signer") else "-",
            r.get("dvc", "-"),
            r["summary"],
        ]
        for r in rows
    ]
    if not dvc_on:
        table = [line[:6] + line[7:] for line in table]
    data = {"run_dir": str(run_dir), "dvc_in_use": dvc_on, "checkpoints": rows}
    emit(args, data, columns(table, right=(0, 3)))
    if not failed:
        return 0
    print(
        f"error: {len(failed)} of {len(listing.committed)} checkpoints failed verification; "
        f"the first: {failed[0]}",
        file=sys.stderr,
    )
    return exit_code(failed[0])


def audit_text(report: audit.Report) -> str:
    """One line per link, newest first."""
    out = [f"audit of {report.path}"]
    marks = {audit.OK: "[ok]    ", audit.PRUNED: "[pruned]", audit.FAILED: "[FAILED]"}
    for i, link in enumerate(report.links):
        arrow = "" if i == 0 else f"<- {link.relation}: "
        parts = [f"{marks[link.status]} {arrow}{link.name}", f"step {link.step}"]
        if link.purpose:
            parts.append(link.purpose)
        if link.run_id:
            parts.append(f"run {str(link.run_id)[:8]}")
        if link.status == audit.OK:
            code = link.code or {}
            parts.append(f"signer {signer_text(link.signer)}")
            commit = code.get("commit")
            parts.append(
                "code "
                + (str(commit)[:10] if commit else "not-git")
                + (" dirty" if code.get("dirty") else "")
            )
            data = str(link.dataset)
            parts.append(f"data {data[:23] + '…' if len(data) > 24 else data}")
            if link.world_size is not None:
                parts.append(f"world {link.world_size}")
        elif link.status == audit.PRUNED:
            parts.append(
                f"not on disk (deleted by retention), recorded sha256 {str(link.sha256)[:16]}"
            )
        if link.resharded:
            parts.append(
                f"resharded {link.resharded.get('from')}->{link.resharded.get('to')} ranks"
            )
        if link.drift:
            parts.append("drift since: " + ",".join(link.drift))
        out.append("  " + "  ".join(parts))
        if link.error:
            out.append(f"      error: {link.error}")
    if report.lineage:
        first = report.lineage[0]
        out.append(f"  -- start of run {str(first.get('run_id'))[:8]} (fresh)")
        kinds = [s.get("kind") for s in report.lineage]
        out.append(
            f"segments: {len(kinds)} ({', '.join(str(k) for k in kinds)}); "
            f"links: {len(report.links)}, "
            f"verified {sum(link.status == audit.OK for link in report.links)}, "
            f"pruned {sum(link.status == audit.PRUNED for link in report.links)}, "
            f"failed {len(report.failures)}"
        )
    out.append("result: " + ("OK" if report.ok else f"FAILED at {report.failures[0].name}"))
    return "\n".join(out)


def cmd_audit(args: argparse.Namespace) -> int:
    report = audit.audit(
        Path(args.path),
        trust_of(args),
        allow_untrusted=args.allow_untrusted,
        root=Path(args.root) if args.root else None,
    )
    emit(args, report.as_dict(), audit_text(report))
    if report.ok:
        return 0
    first = report.failures[0]
    print(f"error: audit failed at {first.name}: {first.error}", file=sys.stderr)
    return exit_code(first.exception) if first.exception else 1


def register(sub: Any) -> None:
    """Add ``ls``, ``verify``, ``inspect`` and ``audit`` to the subcommands."""
    p = sub.add_parser("ls", help="table of a run's checkpoints, each verified, with signer")
    p.add_argument("run_dir", help="<checkpoint.root>/<run.name>")
    p.set_defaults(func=cmd_ls)
    add_trust_flags(p)
    p = sub.add_parser("verify", help="signature, trust, every file's hash, purpose contract")
    p.add_argument("path")
    p.set_defaults(func=cmd_verify)
    add_trust_flags(p)
    p = sub.add_parser("inspect", help="step, purpose, signer, components, digests, provenance")
    p.add_argument("path")
    p.set_defaults(func=cmd_inspect)
    add_trust_flags(p)
    p = sub.add_parser("audit", help="verify and walk the lineage back to the run's start")
    p.add_argument("path")
    p.add_argument(
        "--root", help="checkpoint root to find ancestors in (default: above the run dir)"
    )
    p.set_defaults(func=cmd_audit)
    add_trust_flags(p)
