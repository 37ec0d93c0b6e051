"""Named pause points, so tests and drills can kill a process at an exact place.

A process started with ``RECOVERY_PAUSE_AT=<point>`` (comma-separated for
several) stops when it reaches that point: it writes the point's name to the
file named by ``RECOVERY_PAUSE_MARK``, with its pid on the next line (so the
driver knows it is there, and which process of a ``torchrun`` job to kill),
and sleeps until it is killed. Points are ``step-<N>`` (after step N is recorded,
on the way out of ``Checkpointer.maybe_save``: in any loop that calls it),
and ``commit-<phase>-<N>`` inside the commit of step N's checkpoint, with phase
``write`` (a tensor file half written), ``before-manifest`` (all data files
durable, manifest not yet written) and ``before-rename`` (manifest durable,
directory not yet renamed) (``local-<phase>-<N>`` and ``promote-<phase>-<N>``: the same
phases of a local-tier snapshot and of its promotion, :mod:`recovery.run.tiers.rules`),
``rank-<R>-write-<N>`` and ``rank-<R>-sharded-<N>``
(rank R of a distributed save has written its own files, or its DCP shards),
``dvc-register-<N>`` (the background DVC
publisher about to register step N's committed checkpoint), and
``best-copy-<N>``/``best-swap-<N>`` (the best copy of step N complete but not
committed / committed beside the old best, which is not yet removed).

With ``RECOVERY_PAUSE_RELEASE=<file>`` as well, the pause ends when that file
appears (the driver can send a signal first, then let the process go on to
handle it), and the point is passed only once.

Without the variable, :func:`reach` is one environment lookup; it never
changes behaviour otherwise.
"""

from __future__ import annotations

import os
import time

PAUSE_ENV = "RECOVERY_PAUSE_AT"
MARK_ENV = "RECOVERY_PAUSE_MARK"
RELEASE_ENV = "RECOVERY_PAUSE_RELEASE"
_passed: set[str] = set()


def _armed() -> frozenset[str]:
    raw = os.environ.get(PAUSE_ENV, "")
    return frozenset(p.strip() for p in raw.split(",") if p.strip())


def reach(point: str) -> None:
    """Pause here if ``point`` is armed (forever, or until released); else return at once."""
    if point not in _armed() or point in _passed:
        return
    mark = os.environ.get(MARK_ENV)
    if mark:
        tmp = f"{mark}.{os.getpid()}.tmp"  # ranks of one job may pause at once
        with open(tmp, "w") as fh:
            fh.write(f"{point}\n{os.getpid()}\n")
        os.replace(tmp, mark)
    release = os.environ.get(RELEASE_ENV)
    while True:  # wait for the driver's signal, or its release file
        if release and os.path.exists(release):
            _passed.add(point)
            return
        time.sleep(0.02 if release else 3600)
