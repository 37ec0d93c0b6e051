"""What a path that is not a committed checkpoint is, said so that the user knows what to
pass instead: a missing path, a file, a run directory, or a directory with no ``model.sig``
(:func:`recovery.integrity.reads.reader.read_manifest` raises these)."""

from __future__ import annotations

from pathlib import Path

from recovery.errors import CheckpointNotFoundError, ManifestError
from recovery.format.layout import METRICS_FILE, SIGNATURE_FILE, Listing, parse_step, scan


def not_a_directory(path: Path) -> str:
    """Why ``path``, which is no directory, is no checkpoint, and what to pass instead."""
    if not path.exists():
        return f"{path}: no such checkpoint directory"
    found = "a file" if path.is_file() else "not a directory"
    # a file of a checkpoint (its model.sig, a tensor file): the directory is what was meant
    inside = f"; pass {path.parent}" if (path.parent / SIGNATURE_FILE).is_file() else ""
    return (
        f"{path}: is {found}, not a checkpoint; a checkpoint is a directory (step-NNNNNNNN/ "
        f"holding {SIGNATURE_FILE} and the files it signs){inside}"
    )


def unsigned(path: Path) -> CheckpointNotFoundError | ManifestError:
    """The error for a directory with no ``model.sig``: a run directory, or an uncommitted
    (or unrelated) directory."""
    try:
        listing = scan(path)
    except OSError:  # unlistable: say what the reader was sure of, that model.sig is absent
        listing = Listing([], [])
    journal = (path / METRICS_FILE).is_file()
    if parse_step(path.name) is None and (listing.committed or journal):
        held = " and ".join(
            (["step-* checkpoint directories"] if listing.committed else [])
            + ([METRICS_FILE] if journal else [])
        )
        steps = [step for step, _ in listing.committed]
        pick = (
            f"pass one of its step directories ({listing.committed[-1][1]} is the newest), or "
            if steps
            else "it holds no committed checkpoint yet; "
        )
        return CheckpointNotFoundError(
            f"{path}: is a run directory (it holds {held}), not a checkpoint; {pick}to resume "
            f"the configured run use +resume=latest or +resume=<step>"
            + (f" (committed steps: {steps})" if steps else ""),
            path=path,
        )
    if parse_step(path.name) is not None:
        return ManifestError(
            f"{path / SIGNATURE_FILE}: missing. The directory was never committed (or its "
            "signature was deleted); resume from another checkpoint.",
            path=path / SIGNATURE_FILE,
        )
    return ManifestError(
        f"{path / SIGNATURE_FILE}: missing; {path} is not a committed checkpoint (a checkpoint "
        f"directory holds {SIGNATURE_FILE} beside the files it signs). Pass a checkpoint "
        "directory; if this is one, it was never committed or its signature was deleted.",
        path=path / SIGNATURE_FILE,
    )
