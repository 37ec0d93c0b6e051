"""``recovery ls``: a run's checkpoints as a table, each one verified. It never writes.

A row is what the verified bytes say, never what a file claims; a checkpoint that
fails verification is a row saying what failed and where (:func:`verdict`), and
fails the command with its exit code (:mod:`recovery.cli.codes`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from recovery import errors
from recovery.cli.codes import EXIT_CODES, exit_code
from recovery.cli.commands import tierrows
from recovery.cli.common import (
    add_trust_flags,
    emit,
    human_size,
    signer_text,
    trust_of,
)
from recovery.format.layout import (
    CONFIG_FILE,
    METRICS_FILE,
    SIGNATURE_FILE,
    Listing,
    parse_step,
    scan,
)
from recovery.run import journal
from recovery.run.restoring import checked
from recovery.run.scheduling import slurm
from recovery.storage import tracking
from recovery.tools.report.run import Story, story

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
    errors.UnreadableFileError: "UNREADABLE: {file}",
    errors.FormatError: "UNDECODABLE: {file}",
    errors.PurposeError: "INCOMPLETE: lacks what its purpose requires",
    errors.BrokenChainError: "BROKEN CHAIN: its base {base} is missing or damaged",
}


def verdict(err: errors.RecoveryError, ckpt: Path) -> str:
    """The status column of a checkpoint that failed: what failed, and in which file."""
    file = err.path if err.path is not None and err.path != ckpt else Path(ckpt.name)
    if file.is_relative_to(ckpt):
        file = file.relative_to(ckpt)
    for cls in type(err).__mro__:
        if cls in VERDICTS:
            key, run = getattr(err, "key_id", "")[:12], getattr(err, "run_id", "")[:8]
            base = getattr(err, "base", Path()).name
            return VERDICTS[cls].format(file=file.as_posix(), key=key, run=run, base=base)
    return "FAILED: " + next(what for cls, _, what in EXIT_CODES if isinstance(err, cls))


def ls_row(path: Path, args: argparse.Namespace, trust: Any) -> dict[str, Any]:
    """One committed checkpoint, verified (no tensor decoded: :func:`.checked.check`); a
    failure's error is kept under ``exception``."""
    row: dict[str, Any] = {"path": str(path), "purpose": None, "size": 0}
    try:
        loaded = checked.check(path, trust, allow_untrusted=args.allow_untrusted)
    except errors.RecoveryError as err:
        # status stays the class name (what scripts match on); summary is the table's text
        row.update(verified=False, status=type(err).__name__, summary=verdict(err, path))
        row.update(error=str(err), exit_code=exit_code(err), exception=err)
        if isinstance(err, errors.UntrustedSignerError):
            row["key_id"] = err.key_id
        return row
    metrics = loaded.meta.get("metrics", {})
    delta = loaded.delta
    summary = f"ok, delta of {delta['base']}" if delta is not None else "ok"
    row.update(purpose=loaded.manifest.purpose, verified=True, status="ok", summary=summary)
    row["tier"] = loaded.manifest.recovery.get("tier", tierrows.PERSISTENT)  # signed
    row["base"] = delta["base"] if delta is not None else None
    row.update(size=sum(r.size for r in loaded.manifest.files), loss=metrics.get("loss"))
    row["signer"] = checked.signer(loaded.manifest)
    row["dvc_enabled"] = dvc_enabled(loaded.documents.get(CONFIG_FILE))
    return row


def dvc_enabled(config: object) -> bool | None:
    """``checkpoint.dvc.enabled`` of the config a checkpoint recorded (``train.py``'s);
    ``None`` when it recorded none that says (an own loop's config is its own)."""
    if not isinstance(config, bytes):
        return None
    try:
        doc = yaml.safe_load(config)
    except yaml.YAMLError:
        return None
    checkpoint = doc.get("checkpoint") if isinstance(doc, dict) else None
    dvc = checkpoint.get("dvc") if isinstance(checkpoint, dict) else None
    enabled = dvc.get("enabled") if isinstance(dvc, dict) else None
    return enabled if isinstance(enabled, bool) else None


def listing_of(path: Path) -> tuple[Path, Listing]:
    """The run directory and the checkpoints ``recovery ls PATH`` shows: a run's, or, when
    ``path`` is one checkpoint (a step directory or an artifact), that one alone.

    Raises:
        CheckpointNotFoundError: ``path`` is no directory, or holds no checkpoint at all.
    """
    if not path.is_dir():
        raise errors.CheckpointNotFoundError(f"{path}: no such run directory", path=path)
    step = parse_step(path.name)
    if step is not None or (path / SIGNATURE_FILE).exists():
        return path.parent, Listing(committed=[(step if step is not None else -1, path)], stale=[])
    return path, scan(path)


def columns(table: list[list[str]], right: tuple[int, ...]) -> str:
    """Each column padded to its widest cell (``right`` ones right-aligned), the last as is."""
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
    pad = [str.rjust if i in right else str.ljust for i in range(len(widths))]
    return "\n".join(
        "  ".join([*(pad[i](c, widths[i]) for i, c in enumerate(line[:-1])), line[-1]])
        for line in table
    )


def run_story(run_dir: Path) -> Story:
    """The run's journal read as its history of events (empty without a journal): the
    per-step records are not read (the table shows none)."""
    path = run_dir / METRICS_FILE
    return story(r for _, r in journal.events(path)) if path.is_file() else Story()


def resume_checks(run_dir: Path, st: Story | None = None) -> list[dict[str, Any]]:
    """Each resume the run's journal records, with its self-check (what the run says: the
    journal is not signed)."""
    return [
        {
            "step": r.step,
            "from": r.name,
            "check": r.checked,
            "status": (r.check or {}).get("status"),
        }
        for r in (st if st is not None else run_story(run_dir)).resumes
    ]


def history_lines(st: Story) -> list[str]:
    """What ``ls`` prints below the table: each resume with its self-check and the
    scheduler job it ran in (``SLURM job 41 restart 2 after time limit (SIGUSR1)``), and
    each requeued start that began afresh (killed before its first checkpoint)."""
    lines = [
        f"resumed at step {r.step} from {r.name}: {r.checked}"
        + (f"; {slurm.describe(r.job)}" if r.job else "")
        for r in st.resumes
    ]
    requeued = [id(j) for j in st.requeues]
    lines += [
        f"began afresh ({p.kind}): {p.scheduled}"
        for p in st.processes
        if p.kind != "resume" and id(p.job) in requeued
    ]
    return lines


def cmd_ls(args: argparse.Namespace) -> int:
    """List a run's checkpoints, each verified; exit with the first failure's code.

    A partial write (an uncommitted temp directory) and a ``remote-only``
    checkpoint (a ``.dvc`` file whose directory is not here) are listed, not
    failures. The DVC column is shown only when the run directory is in a DVC
    repository or holds DVC files or tracking records (``--json`` always has it).
    """
    run_dir, listing = listing_of(Path(args.run_dir))
    one = Path(args.run_dir) if run_dir != Path(args.run_dir) else None
    trust = trust_of(args)
    dvc_state, tracked = tracking.status(run_dir), tracking.tracked_steps(run_dir)
    if one is not None:  # one checkpoint: the run's other DVC records are not its rows
        tracked = {}
    elif not listing.committed and not listing.stale and not tracked:
        raise errors.CheckpointNotFoundError(
            f"{run_dir}: holds no checkpoints (no step-* directory, no partial write, no "
            "DVC record); point ls at <checkpoint.root>/<run.name> of a run that saved one",
            path=run_dir,
        )
    in_repo = tracking.find_repo(run_dir) is not None
    dvc_on = in_repo or bool(dvc_state) or bool(tracked)
    rows: list[dict[str, Any]] = []
    pending = "pending" if in_repo else "-"
    for step, path in listing.committed:
        st = dvc_state.get(path.name, tracking.Status())
        row = ls_row(path, args, trust)
        # "off": the run said checkpoint.dvc.enabled=false, so nothing is pending
        off = "off" if row.pop("dvc_enabled", None) is False else pending
        dvc = "pushed" if st.pushed else "registered" if st.registered else off
        rows.append({"step": None if step < 0 else step, **row, "dvc": dvc})
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
    rows += tierrows.local_rows(run_dir, args, trust, ls_row) if one is None else []
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
    told = run_story(run_dir) if one is None else Story()
    resumes = resume_checks(run_dir, told)
    jobs = [p.job for p in told.processes if p.job is not None]
    data = {"run_dir": str(run_dir), "dvc_in_use": dvc_on, "checkpoints": rows,
            "resumes": resumes, "jobs": jobs}  # fmt: skip
    lines = history_lines(told)
    emit(args, data, "\n".join([columns(table, right=(0, 3)), *lines]))
    if not failed:
        return 0
    print(
        f"error: {len(failed)} of {len(listing.committed)} checkpoints failed verification; "
        f"the first: {failed[0]}",
        file=sys.stderr,
    )
    return exit_code(failed[0])


def register(sub: Any) -> None:
    """Add ``ls`` to the subcommands."""
    p = sub.add_parser("ls", help="table of a run's checkpoints, each verified, with signer")
    p.add_argument("run_dir", help="<checkpoint.root>/<run.name>")
    p.set_defaults(func=cmd_ls)
    add_trust_flags(p)
