"""DVC tracking of committed checkpoints: register, push, fetch, and a background publisher.

Storage must outlive compute: after a checkpoint commits, its directory is
registered with DVC (``step-N.dvc`` beside it, never inside the signed
directory) and, when asked, pushed to the default remote. A fresh machine with
the ``.dvc`` files (from git) but neither the directories nor the cache pulls
the newest checkpoint back (:func:`materialize`) and resumes from it.

Registration runs on a background thread (:class:`Publisher`): DVC holds a
repository lock, and a lock held by another process (a ``dvc`` command, a
second run) must never crash or stall training, so a
:class:`dvc.lock.LockError` means "retry later, with backoff". What has been
registered and pushed is recorded in ``<run dir>/tracking.jsonl`` (last record
of a name wins), which ``recovery ls`` shows and ``recovery sync`` completes.

Inside a ``dvc repro`` stage (``DVC_STAGE`` set) nothing is added: a stage's
outputs belong to the stage.

Rejected: ``checkpoint: true`` outputs in ``dvc.yaml`` (removed in DVC 3), and
a ``dvc add`` in the training thread (a lock wait would stall a step).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery import faults
from recovery.errors import ConfigError, RecoveryError, TrackingError
from recovery.format import bounded
from recovery.format.layout import parse_step
from recovery.integrity import nofollow
from recovery.integrity.commits import reaping
from recovery.integrity.keys.signing import TrustStore
from recovery.integrity.reads import listed

log = logging.getLogger(__name__)

TRACKING_FILE = "tracking.jsonl"
STAGE_ENV = "DVC_STAGE"
BACKOFF = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0)

# DVC talks to no network unless asked to push: no analytics, no update checks.
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@contextmanager
def _quiet() -> Iterator[None]:
    # pygtrie inside DVC emits a DeprecationWarning on import and use: not ours to fail on
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        yield


def _dvc_logging() -> None:
    """Route DVC's log records through ours, warnings and up.

    ``import dvc`` installs handlers bound to the ``sys.stderr`` of that moment
    (in a test, a capture stream that is closed later, and then every ``dvc add``
    fails "to log"); its INFO lines ("To track the changes with git, ...") are
    noise in a training log.
    """
    dvc_log = logging.getLogger("dvc")
    for handler in list(dvc_log.handlers):
        dvc_log.removeHandler(handler)
    dvc_log.propagate = True
    dvc_log.setLevel(logging.WARNING)


def find_repo(path: Path) -> Path | None:
    """The root of the DVC repository containing ``path``, or ``None``."""
    current = path.resolve()
    for candidate in [current, *current.parents]:
        if (candidate / ".dvc").is_dir() and (candidate / ".dvc" / "config").exists():
            return candidate
    return None


def dvc_file(ckpt: Path) -> Path:
    """``step-N.dvc`` beside the directory ``step-N``."""
    return ckpt.with_name(ckpt.name + ".dvc")


def require_dvc(what: str) -> None:
    """Refuse, naming the extra to install, when DVC is not installed.

    Raises:
        ConfigError: ``dvc`` cannot be imported.
    """
    # find_spec, not an import: registering runs on the background thread, and importing
    # DVC (half a second) should not delay the run's start
    if importlib.util.find_spec("dvc") is None:
        raise ConfigError(
            f"{what} needs DVC, which is not installed: pip install -e '.[dvc]' "
            "(or set checkpoint.dvc.enabled=false)"
        )


def _repo(root: Path) -> Any:
    require_dvc(f"{root}: DVC tracking")
    with _quiet():
        from dvc.repo import Repo

        _dvc_logging()
        return Repo(str(root))


def _lock_error() -> type[Exception]:
    with _quiet():
        from dvc.lock import LockError

        _dvc_logging()

        error: type[Exception] = LockError
        return error


def register(root: Path, dirs: list[Path]) -> bool:
    """``dvc add`` each directory (one ``.dvc`` file beside each); ``False`` when nothing
    may be added here (inside a ``dvc repro``/``dvc exp run`` stage, which must not change
    what DVC tracks while DVC runs it:
    ``recovery sync`` registers them afterwards).

    Raises:
        dvc.lock.LockError: another process holds the repository lock.
        TrackingError: DVC refused for another reason.
        UnsafePathError: a name DVC would write (``<dir>.dvc``, the ``.gitignore`` beside
            it) or the directory itself is a symlink: DVC follows links, so nothing is added.
    """
    if os.environ.get(STAGE_ENV):
        log.info(
            "inside DVC stage %s: not adding %s (`recovery sync` registers it afterwards)",
            os.environ[STAGE_ENV],
            ", ".join(str(d) for d in dirs),
        )
        return False
    for d in dirs:
        nofollow.refuse_link(d, "a committed checkpoint to register")
        nofollow.refuse_link(dvc_file(d), "DVC's record of a checkpoint (or nothing)")
        nofollow.refuse_link(d.parent / ".gitignore", "the .gitignore DVC keeps")
    with _quiet():
        repo = _repo(root)
        try:
            repo.add([str(d) for d in dirs])
        except _lock_error():
            raise
        except Exception as err:
            names = ", ".join(str(d) for d in dirs)
            raise TrackingError(f"dvc add {names}: {err}", path=dirs[0] if dirs else None) from err
        finally:
            repo.close()
    return True


def push(root: Path, dirs: list[Path], *, remote: str | None = None) -> None:
    """``dvc push`` the given checkpoint directories' data to ``remote`` (default remote).

    Raises:
        dvc.lock.LockError, TrackingError.
    """
    with _quiet():
        repo = _repo(root)
        try:
            repo.push(targets=[str(dvc_file(d)) for d in dirs], remote=remote)
        except _lock_error():
            raise
        except Exception as err:
            raise TrackingError(
                f"dvc push {', '.join(str(d) for d in dirs)} to {remote or 'the default remote'}: "
                f"{err}. Check the remote "
                "(`dvc remote list`) and its credentials; `recovery sync` retries.",
                path=dirs[0] if dirs else None,
            ) from err
        finally:
            repo.close()


def materialize(ckpt: Path, *, remote: str | None = None) -> Path:
    """Bring a checkpoint that exists only as ``step-N.dvc`` back into the workspace.

    Raises:
        TrackingError: no repository, or the data is neither in the cache nor on the remote.
    """
    root = find_repo(ckpt.parent)
    if root is None:
        raise TrackingError(f"{dvc_file(ckpt)}: not inside a DVC repository", path=ckpt)
    with _quiet():
        repo = _repo(root)
        try:
            repo.pull(targets=[str(dvc_file(ckpt))], remote=remote)
        except Exception as err:
            raise TrackingError(
                f"{dvc_file(ckpt)}: could not fetch the checkpoint from the DVC cache or remote "
                f"({err}). Is the remote reachable (`dvc remote list`)?",
                path=ckpt,
            ) from err
        finally:
            repo.close()
    log.info("fetched %s from DVC", ckpt)
    return ckpt


def untrack(ckpt: Path) -> None:
    """Remove a checkpoint's ``.dvc`` file and its line in the ``.gitignore`` DVC wrote."""
    dvc_file(ckpt).unlink(missing_ok=True)  # unlinking a link removes the link only
    ignore = ckpt.parent / ".gitignore"
    nofollow.refuse_link(ignore, "the .gitignore DVC keeps")
    if ignore.exists():
        lines = ignore.read_text().splitlines()
        kept = [ln for ln in lines if ln.strip() != f"/{ckpt.name}"]
        if kept != lines:
            ignore.write_text("".join(f"{ln}\n" for ln in kept))


def tracked_steps(run_dir: Path) -> dict[int, Path]:
    """Step -> checkpoint path, for every ``step-N.dvc`` file in ``run_dir``."""
    out = {}
    for f in run_dir.glob("step-*.dvc") if run_dir.is_dir() else []:
        step = parse_step(f.name[: -len(".dvc")])
        if step is not None:
            out[step] = f.with_suffix("")
    return out


@dataclass
class Status:
    """What DVC knows of one checkpoint."""

    registered: bool = False
    pushed: bool = False


def status(run_dir: Path) -> dict[str, Status]:
    """Checkpoint name -> registered/pushed, from ``tracking.jsonl`` and the ``.dvc`` files."""
    out: dict[str, Status] = {}
    path = run_dir / TRACKING_FILE
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = bounded.json_loads(line)
            except ValueError:
                continue
            st = out.setdefault(rec["name"], Status())
            st.registered = st.registered or rec.get("registered", False)
            st.pushed = st.pushed or rec.get("pushed", False)
    for name, st in out.items():
        st.registered = st.registered and (run_dir / f"{name}.dvc").exists()
    return out


def record(run_dir: Path, name: str, **fields: Any) -> None:
    """Append one tracking record."""
    with nofollow.open_append(run_dir / TRACKING_FILE, "the run's DVC tracking record") as fh:
        fh.write(json.dumps({"name": name, "time": time.time(), **fields}) + "\n")


class Publisher:
    """Registers (and optionally pushes) committed checkpoints on a background thread.

    Args:
        root: the DVC repository root.
        push: push each registered checkpoint to the remote.
        remote: remote name (default: the repository's default remote).
        sleep: the backoff sleep (tests pass a fake).
    """

    def __init__(
        self,
        root: Path,
        *,
        push: bool = False,
        remote: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        require_dvc(f"{root}: registering checkpoints")
        self.root = root
        self.push = push
        self.remote = remote
        self.sleep = sleep
        # one queue for registrations and retention's deletions, so a deletion never races
        # a registration of the same directory and the training thread never waits for DVC
        self._todo: queue.Queue[tuple[str, Path] | None] = queue.Queue()
        self._busy = 0
        self._cond = threading.Condition()
        self.errors: dict[Path, str] = {}
        """Why each checkpoint that failed to publish failed (its last error)."""
        self._thread = threading.Thread(target=self._run, name="recovery-dvc", daemon=True)
        self._thread.start()

    def submit(self, ckpt: Path) -> None:
        """Register (and push) ``ckpt`` when DVC is free."""
        self._put("publish", ckpt)

    def retire(self, ckpt: Path) -> None:
        """Delete ``ckpt`` and its ``.dvc`` file, after any registration queued before."""
        self._put("retire", ckpt)

    def _put(self, kind: str, ckpt: Path) -> None:
        with self._cond:
            self._busy += 1
        self._todo.put((kind, ckpt))

    def _run(self) -> None:
        while (job := self._todo.get()) is not None:
            kind, ckpt = job
            try:
                if kind == "retire":
                    reaping.discard(ckpt, fault_point=f"retire-{parse_step(ckpt.name)}")
                    untrack(ckpt)
                else:
                    self._publish(ckpt)
            except Exception as err:  # never let tracking take training down
                self.errors[ckpt] = str(err)
                log.warning("DVC tracking of %s failed: %s; `recovery sync` will retry", ckpt, err)
            finally:
                with self._cond:
                    self._busy -= 1
                    self._cond.notify_all()

    def _publish(self, ckpt: Path) -> None:
        if local_snapshot(ckpt):
            log.warning("DVC: not registering %s: a local-tier snapshot is not durable", ckpt)
            return
        lock_error = _lock_error()
        for attempt, delay in enumerate((*BACKOFF, None)):
            try:
                if not ckpt.is_dir():
                    return  # replaced or removed meanwhile
                step = parse_step(ckpt.name)
                if step is not None and attempt == 0:
                    faults.reach(f"dvc-register-{step}")
                if not register(self.root, [ckpt]):
                    return  # inside a DVC stage: pending, not registered
                record(ckpt.parent, ckpt.name, registered=True)
                if self.push:
                    if step is not None and attempt == 0:
                        faults.reach(f"dvc-push-{step}")
                    push(self.root, [ckpt], remote=self.remote)
                    record(ckpt.parent, ckpt.name, registered=True, pushed=True)
                log.info("DVC: %s %s", "registered and pushed" if self.push else "registered", ckpt)
                return
            except lock_error:
                if delay is None:
                    raise TrackingError(
                        f"DVC repository {self.root} stayed locked; {ckpt} is pending "
                        "(`recovery sync` finishes it)",
                        path=ckpt,
                    ) from None
                log.info(
                    "DVC is locked by another process; retrying %s in %.1fs (try %d)",
                    ckpt,
                    delay,
                    attempt + 1,
                )
                self.sleep(delay)

    def close(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for pending work; stop the thread. True if all finished."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._busy and time.monotonic() < deadline:
                self._cond.wait(timeout=max(0.0, deadline - time.monotonic()))
            done = self._busy == 0
        self._todo.put(None)
        if done:
            self._thread.join(timeout=5)
        else:
            log.warning(
                "DVC tracking still has %d checkpoint(s) pending after %.0fs; they stay pending "
                "(see `recovery ls`); run `recovery sync` to finish them",
                self._busy,
                timeout_s,
            )
        return done


def local_snapshot(ckpt: Path) -> bool:
    """Whether ``ckpt``'s statement says it is a local-tier snapshot (``tier: local``), copied
    into a run directory: never registered or pushed as a checkpoint. The statement is read,
    not verified: a forged ``local`` only keeps a checkpoint from DVC."""
    try:
        mf = listed.read_manifest(ckpt, TrustStore(), allow_untrusted=True)
    except RecoveryError:
        return False
    return mf.recovery.get("tier") == "local"
