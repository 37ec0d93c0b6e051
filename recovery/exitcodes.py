"""Exit codes: one per error class, the table README.md lists.

The CLI chooses them (:mod:`recovery.cli.codes`), and so does an own loop's
:class:`~recovery.run.checkpointer.Checkpointer` at the end of its with-block (or
through :meth:`~recovery.run.checkpointer.Checkpointer.exit_on_error`), so a library error
ends a user's script with the same code and one line as ``recovery`` and ``train.py``.
"""

from __future__ import annotations

from recovery import errors

# Most specific first: the first isinstance match decides the code.
EXIT_CODES: list[tuple[type[BaseException], int, str]] = [
    (errors.CheckpointNotFoundError, 3, "checkpoint not found"),
    (errors.ManifestError, 4, "manifest missing or malformed (uncommitted or damaged)"),
    (errors.UnsafePathError, 5, "unsafe path or symlink (read, or where a writer writes)"),
    (errors.MissingFileError, 6, "a listed file is missing"),
    (errors.ExtraFileError, 7, "an unlisted or unclaimed file is present"),
    (errors.TruncatedFileError, 8, "a file has the wrong size"),
    (errors.DigestMismatchError, 9, "a file's sha256 does not match"),
    (errors.UnreadableFileError, 27, "a checkpoint file cannot be read (permissions, I/O)"),
    (
        errors.PermissionDeniedError,
        31,
        "permission denied: a key, file or directory this user may not read or write",
    ),
    (errors.SignatureError, 16, "signature bundle malformed or signature invalid"),
    (errors.UntrustedSignerError, 17, "signer not in the trust store"),
    (errors.ForeignCheckpointError, 24, "a checkpoint of another run in this run's directory"),
    (errors.BrokenChainError, 29, "a differential checkpoint's base is missing or damaged"),
    (errors.VerificationError, 15, "verification failed"),
    (errors.PurposeError, 18, "artifact's purpose cannot serve the requested use"),
    (errors.RollbackError, 25, "strict resume refused: the run's newest commit is gone"),
    (errors.DriftError, 19, "strict resume refused: code, dependencies, data or config changed"),
    (errors.SigningKeyError, 20, "signing key unreadable or unsupported"),
    (errors.TrackingError, 21, "DVC could not register, push or fetch a checkpoint"),
    (
        errors.Preempted,
        75,
        "preempted: checkpointed at the step boundary, requeue with +resume=latest "
        "(75 unless checkpoint.preempt_exit_code says otherwise)",
    ),
    (errors.ExportError, 22, "export failed its parity check; no artifact was left"),
    (errors.InexactResumeError, 30, "a resumed run redid a step differently (strict resume check)"),
    (errors.DrillError, 23, "a drill or preflight found that recovery does not reproduce the run"),
    (errors.FormatError, 10, "verified bytes do not decode"),
    (errors.IncompatibleStateError, 11, "checkpoint does not fit this run"),
    (errors.ConfigError, 12, "invalid configuration"),
    (errors.RunDirInUseError, 13, "fresh run into a run directory with checkpoints"),
    (
        errors.RunDirLockedError,
        26,
        "another process is writing this run directory, or this writer's lock lost it",
    ),
    (errors.CommitError, 14, "checkpoint could not be committed"),
    (
        errors.StorageError,
        28,
        "checkpoint root or run directory not writable, deleted, or the disk is full",
    ),
    (errors.RecoveryError, 1, "other recovery error"),
]


def exit_code(err: BaseException) -> int:
    """The exit code for an error (1 for anything unlisted; a
    :class:`~recovery.errors.Preempted` carries its own, ``checkpoint.preempt_exit_code``)."""
    if isinstance(err, errors.Preempted):
        return err.exit_status
    for cls, code, _ in EXIT_CODES:
        if isinstance(err, cls):
            return code
    return 1
