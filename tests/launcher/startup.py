"""What a launcher child does at its start, as a fresh interpreter's start-up (or its
``preexec_fn``) would have done it: resource limits, and the variables libraries read on
import that a child applies itself; and the child's record (:data:`RECORD_ENV`)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.launcher.commands import RECORD_ENV, start_ticks

_ELASTIC_LOGGERS: set[str | None] = set()
"""The loggers torchrun's modules set from ``LOGLEVEL`` as they were imported here."""


def track_elastic_loggers() -> None:
    """Note each logger torchrun's modules set up from ``LOGLEVEL`` on import (their
    ``get_logger``), so that a child given ``LOGLEVEL`` can set them as its import would.
    Called before the server's preload imports them."""
    from torch.distributed.elastic.utils import logging as elastic

    setup = elastic._setup_logger
    if getattr(setup, "tracked", False):
        return  # a copy's server: tracked by the server it was forked from

    def tracked(name: str | None = None) -> Any:
        _ELASTIC_LOGGERS.add(name)
        return setup(name)

    tracked.tracked = True  # type: ignore[attr-defined]
    elastic._setup_logger = tracked


def limit(request: dict[str, Any]) -> None:
    """Set the request's resource limits on this process, and drop its capabilities."""
    if request.get("rlimits"):
        import resource

        for which, soft, hard in request["rlimits"]:
            resource.setrlimit(which, (soft, hard))
    if request.get("drop_caps"):
        drop_capabilities(request["drop_caps"])


def drop_capabilities(caps: list[int]) -> None:
    """Drop ``caps`` from this process's bounding, effective, permitted and inheritable
    sets: what root's command exec'd by ``setpriv --bounding-set=-.. --inh-caps=-..``
    holds (``capset(2)``; its children cannot regain them)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in caps:
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), f"launcher: cannot drop capability {cap}")
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this pid
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; two 32-bit words
    if libc.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "launcher: capget failed")
    for cap in caps:
        for field in range(3):
            data[3 * (cap // 32) + field] &= ~(1 << (cap % 32)) & 0xFFFFFFFF
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "launcher: capset failed")


def apply_environment() -> None:
    """Apply what the preloaded modules read from the (new) environment on import:
    ``OMP_NUM_THREADS`` as torch's start-up does, ``LOGLEVEL`` as torchrun's modules do;
    and write this child's record if it is asked for one."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    level = os.environ.get("LOGLEVEL")
    if level:
        import logging

        for name in _ELASTIC_LOGGERS:
            logging.getLogger(name).setLevel(level)
    if os.environ.get(RECORD_ENV):
        record(Path(os.environ[RECORD_ENV]))


def record(directory: Path) -> None:
    """Write this process's record (its start time and environment) into ``directory``."""
    pid = os.getpid()
    tmp = directory / f".{pid}.tmp"
    tmp.write_text(json.dumps({"start": start_ticks(pid), "env": dict(os.environ)}))
    os.replace(tmp, directory / f"{pid}.json")
