"""What some tests need beyond Python: Debian packages that ``make test`` installs where it
can (``tests/provision.sh``: apt-get as root or with passwordless sudo).

Where one is not installed its tests skip with a reason that starts with :data:`PREFIX`,
and the run's closing lines gather those skips into one line naming what to install
(:func:`summary`, from ``tests/conftest.py``): every other test still runs.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

PREFIX = "not installed here: "


@dataclass(frozen=True)
class Need:
    """A system dependency: what it is, how a test finds it, how to install it."""

    label: str
    programs: tuple[str, ...]
    """Any one of them on ``PATH`` or in ``/usr/sbin`` is enough when ``any_of``."""
    install: str
    any_of: bool = False

    def absent(self) -> list[str]:
        """The programs not found (empty: installed)."""
        found = [p for p in self.programs if shutil.which(p) or (Path("/usr/sbin") / p).exists()]
        if self.any_of:
            return [] if found else list(self.programs)
        return [p for p in self.programs if p not in found]


SLURM = Need(
    "SLURM and munge",
    ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel", "srun"),
    "apt-get install slurmctld slurmd slurm-client munge",
)
CHROMIUM = Need(
    "Chromium",
    ("chromium", "chromium-browser", "google-chrome"),
    "apt-get install chromium",
    any_of=True,
)
FUSE = Need("FUSE", ("fusermount3",), "apt-get install fuse3 libfuse2")
"""With /dev/fuse and libfuse2 (which fusepy loads): ``benchmarks/slowstore.py``."""
NEEDS = (SLURM, CHROMIUM, FUSE)


def require(need: Need, *, to_run: bool = True) -> None:
    """Skip the calling test when ``need`` is not installed (the reason names what to
    install); with ``to_run`` (the test starts it), the SLURM tests also skip when not run
    as root (slurmd starts the jobs)."""
    if need.absent():
        pytest.skip(f"{PREFIX}{need.label}: {need.install}")
    if to_run and need is SLURM and os.geteuid() != 0:
        pytest.skip("the SLURM tests run as root (slurmd starts the jobs as root)")


def summary(reasons: Iterable[str]) -> str | None:
    """One line for every skip of :func:`require` among ``reasons`` (None: there was none)."""
    counts: dict[str, int] = {}
    for reason in reasons:
        if PREFIX in reason:
            what = reason.split(PREFIX, 1)[1]
            counts[what] = counts.get(what, 0) + 1
    if not counts:
        return None
    labels = ", ".join(f"{what.split(':')[0]} ({_tests(n)})" for what, n in sorted(counts.items()))
    installs = [i for need in NEEDS for i in [need.install] if any(i in w for w in counts)]
    packages = " ".join(i.removeprefix("apt-get install ") for i in installs)
    how = f"apt-get install {packages} " if packages else ""
    return (
        f"{_tests(sum(counts.values()))} skipped, {PREFIX}{labels}: {how}"
        "(make test installs them when it runs as root or with passwordless sudo)"
    )


def _tests(n: int) -> str:
    return f"{n} test" if n == 1 else f"{n} tests"
