"""tests/system.py: the one closing line that gathers the skips for missing system packages."""

import pytest

from tests import system

SLURM = f"{system.PREFIX}{system.SLURM.label}: {system.SLURM.install}"
CHROMIUM = f"{system.PREFIX}{system.CHROMIUM.label}: {system.CHROMIUM.install}"


@pytest.mark.parametrize(
    ("reasons", "line"),
    [
        ([], None),
        (["Skipped: the mlflow extra is not installed"], None),
        (
            [f"Skipped: {SLURM}"] * 2 + [f"Skipped: {CHROMIUM}"],
            "3 tests skipped, not installed here: Chromium (1 test), SLURM and munge (2 tests): "
            "apt-get install slurmctld slurmd slurm-client munge chromium "
            "(make test installs them when it runs as root or with passwordless sudo)",
        ),
    ],
)
def test_the_skips_for_missing_packages_make_one_line(reasons, line):
    assert system.summary(reasons) == line
