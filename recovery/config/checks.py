"""The checks the config schemas share, each failing with one line.

Every refusal reads ``<key>: <what was expected>, got <what was found>; set e.g.
<key>=<a valid value>``: the key, the expectation, the value and what to do.
"""

from __future__ import annotations

import difflib
import math
import signal
from collections.abc import Iterable

from recovery.errors import ConfigError

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

SEED_MAX = 2**64 - 1
"""The largest seed: ``torch.manual_seed`` takes -2**63 to 2**64-1, numpy's generators
(``default_rng``, ``SeedSequence``) non-negative integers only; 0 to 2**64-1 fits both."""

UNCATCHABLE = frozenset({"SIGKILL", "SIGSTOP"})
"""Signals no handler can catch: never a preemption signal."""

OWN_EXIT_CODES = range(1, 32)
"""The exit codes recovery keeps for its errors (:mod:`recovery.exitcodes`; 2 is a usage
error): never the exit code of a preemption, which a scheduler must tell apart from them."""


def refuse(key: str, problem: str, example: object) -> ConfigError:
    """The one-line error for ``key``: ``<key>: <problem>; set e.g. <key>=<example>``.

    ``problem`` says what was expected and what was found; ``example`` is a valid value.
    """
    return ConfigError(f"{key}: {problem}; set e.g. {key}={example}")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def at_least(key: str, value: object, low: float, example: object, hint: str = "") -> None:
    """Refuse ``value`` unless it is a finite number >= ``low``.

    Raises:
        ConfigError: naming ``key``, the bound, ``value`` and ``example``.
    """
    if not (_number(value) and value >= low):  # type: ignore[operator]
        raise refuse(key, f"must be >= {low}{hint}, got {value!r}", example)


def positive(key: str, value: object, example: object) -> None:
    """Refuse ``value`` unless it is a finite number > 0.

    Raises:
        ConfigError: naming ``key``, ``value`` and ``example``.
    """
    if not (_number(value) and value > 0):  # type: ignore[operator]
        raise refuse(key, f"must be positive, got {value!r}", example)


def within(key: str, value: object, low: float, high: float, *, open_high: bool = False) -> None:
    """Refuse ``value`` unless ``low <= value <= high`` (``< high`` with ``open_high``).

    Raises:
        ConfigError: naming ``key``, the interval, ``value`` and a value inside it.
    """
    inside = _number(value) and low <= value and (value < high if open_high else value <= high)  # type: ignore[operator]
    if not inside:
        bracket = ")" if open_high else "]"
        raise refuse(key, f"must be in [{low}, {high}{bracket}, got {value!r}", low)


def one_of(key: str, value: object, choices: Iterable[str]) -> None:
    """Refuse ``value`` unless it is one of ``choices`` (the first is the example).

    Raises:
        ConfigError: naming ``key``, the choices, ``value`` and the closest choice.
    """
    options = list(choices)
    if value not in options:
        named = ", ".join(options[:-1]) + f" or {options[-1]}" if len(options) > 1 else options[0]
        close = difflib.get_close_matches(str(value), options, n=1, cutoff=0.6)
        raise refuse(key, f"expected {named}, got {value!r}", close[0] if close else options[0])


def not_empty(key: str, value: str | None, example: object) -> None:
    """Refuse an empty string (``None``, unset, is allowed where the schema allows it).

    Raises:
        ConfigError: naming ``key`` and ``example``.
    """
    if value is not None and not str(value).strip():
        raise refuse(key, "expected a value or null (unset), got an empty string", example)


def check_seed(value: object, key: str = "seed") -> int:
    """``value`` as a seed: an integer from 0 to :data:`SEED_MAX`.

    Raises:
        ConfigError: anything else (a negative, fractional or too large number, a string).
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise refuse(
            key,
            f"expected an integer from 0 to 2**64-1 (what torch.manual_seed and numpy's "
            f"generators both accept), got {value!r}",
            0,
        )
    return value


def check_signals(key: str, names: Iterable[object]) -> None:
    """Refuse anything in ``names`` that is not the name of a signal a handler can catch.

    Raises:
        ConfigError: naming ``key`` and the first bad name.
    """
    for name in names:
        text = str(name)
        if text in UNCATCHABLE or text not in signal.Signals.__members__:
            raise refuse(
                key,
                f"expected names of signals a process can catch (SIGTERM, SIGUSR1, SIGINT...; "
                f"not SIGKILL or SIGSTOP), got {name!r}",
                "[SIGTERM,SIGUSR1]",
            )


def check_exit_code(key: str, value: object) -> None:
    """Refuse ``value`` unless it is an integer exit code in 1 to 255 that is none of
    :data:`OWN_EXIT_CODES`.

    Raises:
        ConfigError: naming ``key``, the allowed codes and ``value``.
    """
    valid = isinstance(value, int) and not isinstance(value, bool)
    if not (valid and OWN_EXIT_CODES[-1] < value <= 255):  # type: ignore[operator]
        raise refuse(
            key,
            f"expected an integer exit code in [{OWN_EXIT_CODES[-1] + 1}, 255] "
            f"({OWN_EXIT_CODES[0]}-{OWN_EXIT_CODES[-1]} are recovery's own error codes), "
            f"got {value!r}",
            75,
        )


def parse_duration(text: str | float | int) -> float:
    """Seconds in ``60``, ``90s``, ``5m``, ``24h`` or ``2d``.

    Raises:
        ValueError: not a positive duration.
    """
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).strip().lower()
        unit = _UNITS.get(raw[-1:])
        number = raw[:-1] if unit is not None else raw
        try:
            value = float(number) * (unit or 1.0)
        except ValueError:
            raise ValueError(f"expected a duration like 60s, 5m, 24h or 2d, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"expected a positive duration, got {text!r}")
    return value


def check_duration(key: str, text: str | float | int, example: str) -> None:
    """Refuse ``text`` unless it is a positive duration (:func:`parse_duration`).

    Raises:
        ConfigError: naming ``key``, ``text`` and ``example``.
    """
    try:
        parse_duration(text)
    except ValueError as err:
        raise refuse(key, str(err), example) from None


def did_you_mean(word: str, choices: list[str], *, prefix: str = "") -> str:
    """``; did you mean `prefix.choice`?`` for the choice closest to ``word``, or ``""``."""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    if not close:
        return ""
    return f"; did you mean `{prefix + '.' if prefix else ''}{close[0]}`?"
