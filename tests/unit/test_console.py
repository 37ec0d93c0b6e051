"""recovery.console: the package's lines on stderr when the application configured no
logging, and the hand-over when it configures logging later (once, at its level)."""

from __future__ import annotations

import io
import logging

import pytest

from recovery import console


@pytest.fixture
def bare(capsys):
    """A process whose root logger has no handler, stderr captured (``getvalue``); the
    package logger and the root restored afterwards. pytest puts its capturing handlers on
    the root at the start of each phase, so the test body itself calls ``bare.clear()``."""
    root = logging.getLogger()
    saved_level = root.level
    saved: list[logging.Handler] = []

    class Bare:
        def clear(self) -> None:
            saved[:] = root.handlers
            root.handlers = []

        def getvalue(self) -> str:
            return capsys.readouterr().err

    yield Bare()
    console.withdraw()
    root.handlers, root.level = saved, saved_level


def app_config(level: int) -> io.StringIO:
    """What ``logging.basicConfig(level=level, format="APP %(message)s")`` sets up."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("APP %(message)s"))
    logging.getLogger().addHandler(handler)
    logging.getLogger().setLevel(level)
    return out


def test_with_no_logging_configured_the_package_speaks_at_info(bare):
    bare.clear()
    console.show()
    logging.getLogger("recovery.run.restoring.begin").info("RESUMED run x")
    logging.getLogger("recovery.run.restoring.begin").debug("not this")
    logging.getLogger("other").warning("not ours")  # Python's last resort prints it
    assert bare.getvalue().splitlines() == ["RESUMED run x", "not ours"]


@pytest.mark.parametrize(
    ("level", "records", "seen"),
    [
        (logging.INFO, [(logging.WARNING, "w"), (logging.INFO, "i")], ["APP w", "APP i"]),
        (logging.WARNING, [(logging.INFO, "i"), (logging.WARNING, "w")], ["APP w"]),
        (logging.WARNING, [(logging.WARNING, "w"), (logging.INFO, "i")], ["APP w"]),
    ],
)
def test_a_config_made_later_takes_over_once_at_its_level(bare, level, records, seen):
    bare.clear()
    console.show()
    logging.getLogger("recovery.x").info("before")
    out = app_config(level)
    for lvl, msg in records:
        logging.getLogger("recovery.x").log(lvl, msg)
    assert bare.getvalue().splitlines() == ["before"]
    assert out.getvalue().splitlines() == seen


def test_under_the_applications_config_nothing_is_added(bare):
    bare.clear()
    out = app_config(logging.WARNING)
    console.show()
    logging.getLogger("recovery.x").info("quiet")
    logging.getLogger("recovery.x").warning("w")
    assert logging.getLogger("recovery").handlers == []
    assert out.getvalue().splitlines() == ["APP w"] and bare.getvalue() == ""
