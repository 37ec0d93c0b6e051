"""One exception tree for the whole library.

Every class also subclasses the matching built-in, so callers that only know
``FileNotFoundError`` or ``ValueError`` still catch the right things. Messages
are built by the raiser and name the file, what was expected, what was found
and what to do. Only ``recovery.cli`` maps these classes to exit codes.

::

    RecoveryError(Exception)
    ├── ConfigError(ValueError)                 a config value is out of range
    ├── CheckpointNotFoundError(FileNotFoundError)
    ├── RunDirInUseError(FileExistsError)       fresh run into a dir holding checkpoints
    ├── RunDirLockedError(BlockingIOError)      another process is writing the run directory
    ├── CommitError(OSError)                    a save could not be committed
    ├── VerificationError(ValueError)           the bytes on disk are not what was committed
    │   ├── ManifestError                       manifest missing, unreadable or malformed
    │   ├── UnsafePathError                     ``..``, absolute path or symlink
    │   ├── MissingFileError                    listed file absent
    │   ├── ExtraFileError                      unlisted file present
    │   ├── TruncatedFileError                  size differs from the manifest
    │   ├── DigestMismatchError                 sha256 differs from the manifest
    │   ├── SignatureError                      bundle malformed or signature invalid
    │   ├── UntrustedSignerError                valid bundle, signer not in the trust store
    │   ├── ForeignCheckpointError              another run's checkpoint in this run's directory
    │   └── BrokenChainError                    a delta's base is missing, damaged or replaced
    ├── FormatError(ValueError)                 verified bytes that do not decode
    ├── PurposeError(ValueError)                artifact's purpose cannot serve the requested use
    ├── DriftError(ValueError)                  strict resume refused: code/deps/data/config changed
    │   └── RollbackError                       strict resume refused: the newest commit is gone
    ├── SigningKeyError(ValueError)             a signing key cannot be read or is unsupported
    ├── Preempted                               a preemption signal: checkpointed, requeue me
    ├── StorageError(OSError)                   the checkpoint root cannot be written, the disk full
    ├── PermissionDeniedError(PermissionError)  a key, file or directory this user may not use
    ├── TrackingError(OSError)                  DVC could not register, push or fetch
    ├── ExportError(ValueError)                 an export failed parity or could not be built
    ├── DrillError                              a drill or preflight found a difference
    ├── InexactResumeError                      a resumed run redid a step differently (strict)
    └── IncompatibleStateError(ValueError)      checkpoint does not fit this run
"""

from __future__ import annotations

from pathlib import Path


class RecoveryError(Exception):
    """Base of every error this library raises.

    Attributes:
        path: the file or directory the error is about, when there is one.
    """

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        super().__init__(message)
        self.path = Path(path) if path is not None else None


class ConfigError(RecoveryError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class CheckpointNotFoundError(RecoveryError, FileNotFoundError):
    """The requested checkpoint (step, path or ``latest``) does not exist."""


class RunDirInUseError(RecoveryError, FileExistsError):
    """A fresh run was pointed at a run directory that already holds checkpoints."""


class RunDirLockedError(RecoveryError, BlockingIOError):
    """Another process is writing this run directory (it holds the run's lock).

    Attributes:
        holder: what the lock file says about the holder (pid, host, since).
    """

    def __init__(self, message: str, *, holder: str, path: str | Path | None = None) -> None:
        super().__init__(message, path=path)
        self.holder = holder


class CommitError(RecoveryError, OSError):
    """A checkpoint could not be written and committed; earlier ones are intact."""


class VerificationError(RecoveryError, ValueError):
    """A checkpoint's bytes do not match what its manifest says was committed."""


class UnreadableFileError(VerificationError):
    """A checkpoint's file or directory exists but cannot be read (permissions, I/O error)."""


class ManifestError(VerificationError):
    """The manifest is missing (an uncommitted directory), unreadable or malformed."""


class UnsafePathError(VerificationError):
    """A manifest entry escapes the directory, or the directory holds a symlink."""


class MissingFileError(VerificationError):
    """A file listed in the manifest is absent."""


class ExtraFileError(VerificationError):
    """A file is present that the manifest does not list."""


class TruncatedFileError(VerificationError):
    """A file's size differs from the size recorded in the manifest."""


class DigestMismatchError(VerificationError):
    """A file's sha256 differs from the digest recorded in the manifest."""


class SignatureError(VerificationError):
    """The signature bundle is malformed, or its signature does not verify."""


class BrokenChainError(VerificationError):
    """A differential checkpoint (a delta) cannot be used: the full checkpoint it names as
    its base is missing, fails verification, or is not the one it signed (another digest).

    Attributes:
        base: the base's directory.
    """

    def __init__(self, message: str, *, base: str | Path, path: str | Path | None = None) -> None:
        super().__init__(message, path=path)
        self.base = Path(base)


class UntrustedSignerError(VerificationError):
    """The bundle verifies, but its signer is not in the trust store.

    Attributes:
        key_id: the signer's key id (hex sha256 of its PEM public key).
    """

    def __init__(self, message: str, *, key_id: str, path: str | Path | None = None) -> None:
        super().__init__(message, path=path)
        self.key_id = key_id


class ForeignCheckpointError(VerificationError):
    """A verified checkpoint in a run's directory that another run (run id) wrote.

    Attributes:
        run_id: the run that wrote it; expected: this run's id.
    """

    def __init__(
        self, message: str, *, run_id: str, expected: str, path: str | Path | None = None
    ) -> None:
        super().__init__(message, path=path)
        self.run_id = run_id
        self.expected = expected


class PurposeError(RecoveryError, ValueError):
    """An artifact's declared purpose cannot serve the requested use, or lacks components.

    Attributes:
        missing: the required components the artifact does not hold.
    """

    def __init__(
        self, message: str, *, missing: list[str] | None = None, path: str | Path | None = None
    ) -> None:
        super().__init__(message, path=path)
        self.missing = missing or []


class DriftError(RecoveryError, ValueError):
    """A strict resume was refused because code, dependencies, data or config changed.

    Attributes:
        differences: one line per difference.
    """

    def __init__(
        self, message: str, *, differences: list[str], path: str | Path | None = None
    ) -> None:
        super().__init__(message, path=path)
        self.differences = differences


class RollbackError(DriftError):
    """A strict resume was refused: the newest checkpoint the run committed (its journal says)
    is gone or damaged, and only an older one is there."""


class SigningKeyError(RecoveryError, ValueError):
    """A signing or trusted key cannot be read, or uses an unsupported algorithm."""


class Preempted(RecoveryError):
    """The run received a preemption signal and stopped after a checkpoint.

    Not a failure: the newest checkpoint is complete; requeue the same command
    with ``+resume=latest``.

    Attributes:
        step: the step of the checkpoint written on the way out.
        signal_name: the signal that asked for it.
        exit_status: the process's exit code, ``checkpoint.preempt_exit_code`` (75,
            EX_TEMPFAIL, unless a scheduler retries only other codes).
    """

    def __init__(
        self,
        message: str,
        *,
        step: int,
        signal_name: str,
        path: str | Path | None = None,
        exit_status: int = 75,
    ) -> None:
        super().__init__(message, path=path)
        self.step = step
        self.signal_name = signal_name
        self.exit_status = exit_status


class StorageError(RecoveryError, OSError):
    """The checkpoint root or run directory cannot be created, written or read: read-only,
    permissions, deleted while the run was writing it, or a full disk."""


class PermissionDeniedError(RecoveryError, PermissionError):
    """A key, file or directory that this process may not read or write (its owner or mode
    says no); the message names it, its owner and mode, and this process's user."""


class TrackingError(RecoveryError, OSError):
    """DVC could not register, push or fetch a checkpoint; the checkpoint itself is intact."""


class ExportError(RecoveryError, ValueError):
    """An export failed its parity check or could not be built; no artifact is left behind."""


class DrillError(RecoveryError):
    """A drill or a preflight found that recovery does not reproduce the run."""


class InexactResumeError(RecoveryError):
    """A resumed run recomputed a step differently from the run that died
    (``checkpoint.resume_check.strict``): it is not the same run.

    Attributes:
        step: the first differing step.
        field: the per-step record field that differs (``loss``, ``batch``, ...).
    """

    def __init__(self, message: str, *, step: int, field: str, path: str | Path | None = None):
        super().__init__(message, path=path)
        self.step = step
        self.field = field


class FormatError(RecoveryError, ValueError):
    """Verified bytes that cannot be decoded as the format they claim to be."""


class IncompatibleStateError(RecoveryError, ValueError):
    """A checkpoint whose state does not fit the current run.

    Attributes:
        mismatches: every difference found, one human-readable line each.
    """

    def __init__(
        self, message: str, *, mismatches: list[str], path: str | Path | None = None
    ) -> None:
        super().__init__(message, path=path)
        self.mismatches = mismatches
