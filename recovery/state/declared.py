"""Declared absences: the pieces of state a loop says it does not have, and why.

A loop whose learning rate is a function of the step has no scheduler; one whose
batches are drawn from the RNG has no data position. Rather than register a
stand-in, it declares the absence with a reason
(``TrainState(..., absent={"scheduler": "lr is a function of the step"})``). The
continuation contract accepts the declaration instead of the component
(:mod:`recovery.provenance.purpose`); every checkpoint records it, signed; and a
resume must find the same declaration: a checkpoint without a scheduler resumed
into a run that registers one (or the other way round) would silently train
another schedule, so :func:`mismatches` names it.

Pure functions over names and reasons: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from recovery.errors import ConfigError

RNG = "rng"


def validate(absent: Mapping[str, object], registered: Iterable[str]) -> dict[str, str]:
    """The declarations as a plain ``name -> reason`` dict, once they make sense.

    Raises:
        ConfigError: a name that is not a non-empty string, ``rng`` (always captured),
            a name also registered as a component, or a reason that is not a
            non-empty string.
    """
    have = set(registered)
    out: dict[str, str] = {}
    for name, why in absent.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"TrainState absent=: {name!r} is not a component name")
        if name == RNG:
            raise ConfigError("TrainState absent=: 'rng' is always captured; it cannot be absent")
        if name in have:
            raise ConfigError(
                f"TrainState absent=: {name!r} is registered and declared absent; "
                "drop one of the two"
            )
        if not isinstance(why, str) or not why.strip():
            raise ConfigError(
                f"TrainState absent=: {name!r} needs a reason, e.g. "
                "absent={'scheduler': 'lr is a function of the step'}"
            )
        out[name] = why.strip()
    return out


def mismatches(
    saved_absent: Mapping[str, str],
    saved: Iterable[str],
    live_absent: Mapping[str, str],
    live: Iterable[str],
) -> list[str]:
    """Why a checkpoint's declarations do not fit the live state's: empty if they do.

    Args:
        saved_absent: what the checkpoint declares absent (name -> reason).
        saved: the components the checkpoint holds.
        live_absent: what this run declares absent.
        live: the components this run registers.

    A name absent on one side and held on the other is a mismatch; absent on
    both sides (whatever the reasons) or held on both is not.
    """
    saved_set, live_set = set(saved), set(live)
    problems = [
        f"the checkpoint declares no {name!r} ({why}), but this run registers one: "
        f"declare {name!r} absent here too to resume it, or start a new run"
        for name, why in saved_absent.items()
        if name in live_set
    ]
    problems += [
        f"the checkpoint holds {name!r}, but this run declares it absent ({why}): "
        f"register the {name} it was saved with to resume it"
        for name, why in live_absent.items()
        if name in saved_set
    ]
    return problems


def involved(saved_absent: Mapping[str, str], live_absent: Mapping[str, str]) -> set[str]:
    """The names :func:`mismatches` speaks for (their generic set-difference lines are dropped)."""
    return set(saved_absent) | set(live_absent)


def describe(restored: Iterable[str], absent: Mapping[str, str]) -> str:
    """One line: what a resume restored and what the run declared absent, with the reasons."""
    text = "restored " + (", ".join(restored) or "nothing")
    if absent:
        text += "; declared absent: " + ", ".join(f"{n} ({why})" for n, why in absent.items())
    return text
