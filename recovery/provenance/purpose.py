"""Purposes: what an artifact is for, the components each requires, and who may load it.

An artifact declares one purpose and records that purpose's required
components in its signed statement at write time, so verifying it later needs
no config. The tables here mirror ``conf/purpose/*.yaml`` (a test keeps them
equal) so a library user without Hydra gets the same contracts.

A loop may lack a required piece of state for a reason (its learning rate is a
function of the step, its batches are drawn from the RNG): it declares the
absence with that reason (``TrainState(..., absent={"scheduler": "..."})``),
the declaration is recorded, signed, beside ``requires`` (``absent``), and
the contract accepts it in place of the component (:func:`unmet`,
:func:`declaration_errors`). An undeclared absence is still refused.

Uses and the purposes they accept:

========== ==============================
use        accepted purposes
========== ==============================
resume     continuation
warm_start continuation, warm_start
inference  inference
========== ==============================
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from recovery.errors import ConfigError, PurposeError

CONTINUATION = "continuation"
WARM_START = "warm_start"
INFERENCE = "inference"

RESUME = "resume"
INIT = "warm_start"
SERVE = "inference"

ACCEPTS: dict[str, tuple[str, ...]] = {
    RESUME: (CONTINUATION,),
    INIT: (CONTINUATION, WARM_START),
    SERVE: (INFERENCE,),
}


@dataclass(kw_only=True)
class PurposeSpec:
    """One purpose's contract."""

    name: str
    """continuation, warm_start or inference."""
    requires: list[str] = field(default_factory=list)
    """Components an artifact of this purpose must hold."""
    description: str = ""

    def __post_init__(self) -> None:
        if self.name not in (CONTINUATION, WARM_START, INFERENCE):
            raise ConfigError(
                f"purpose.name: {self.name!r} is not one of continuation, warm_start, inference"
            )


BUILTIN: dict[str, PurposeSpec] = {
    CONTINUATION: PurposeSpec(
        name=CONTINUATION,
        requires=["model", "optimizer", "scheduler", "sampler", "rng", "config", "provenance"],
        description="resume the same run exactly",
    ),
    WARM_START: PurposeSpec(
        name=WARM_START,
        requires=["model", "model_config", "provenance"],
        description="initialise a new run from these weights",
    ),
    INFERENCE: PurposeSpec(
        name=INFERENCE,
        requires=["model", "preprocessing", "io_signature", "lineage"],
        description="serve predictions",
    ),
}


DECLARABLE: tuple[str, ...] = ("scheduler", "sampler", "optimizer")
"""Required components a loop may declare it does not have, with a reason, instead of
registering a stand-in: a learning rate that is a function of the step (nanoGPT's
``g["lr"] = get_lr(step)``) needs no scheduler, batches drawn from the RNG (which
is always captured) need no data position, and a hand-written update
(``p -= lr * p.grad``) needs no optimizer (what it carries across steps, a momentum
buffer say, goes in a ``LoopState``)."""

HOW: dict[str, str] = {
    "scheduler": "the lr is a function of the step",
    "sampler": "batches are drawn from the rng",
    "optimizer": "a hand-written update: p -= lr * p.grad",
}
"""An example reason per declarable component, for the messages."""


ADDED_BY_WRITER = frozenset({"config", "provenance", "lineage", "model_config"})
"""Contract components the checkpointer writes itself, not the state."""


def missing(requires: Iterable[str], present: Iterable[str]) -> list[str]:
    """Required components that are not present, in contract order."""
    have = set(present)
    return [c for c in requires if c not in have]


def unmet(
    requires: Iterable[str], present: Iterable[str], absent: Mapping[str, object] | None = None
) -> list[str]:
    """Required components neither present nor declared absent, in contract order.

    A declaration stands in for a requirement only if it is one of :data:`DECLARABLE`
    (what :func:`declaration_errors` accepts); any other declaration leaves the
    requirement unmet.
    """
    declared = {n for n in absent if n in DECLARABLE} if isinstance(absent, Mapping) else set()
    return [c for c in missing(requires, present) if c not in declared]


def declaration_errors(
    requires: Iterable[str], present: Iterable[str], absent: Mapping[str, object] | None
) -> list[str]:
    """Why declarations of absence cannot be accepted against ``requires``: empty if they can.

    A declaration names a component the contract requires and :data:`DECLARABLE`
    allows, which the artifact (or state) does not also hold, with a non-empty reason.
    """
    if absent is not None and not isinstance(absent, Mapping):
        return [f"'absent' is a {type(absent).__name__}, not a mapping of component -> reason"]
    needed, have = list(requires), set(present)
    problems: list[str] = []
    for name, why in (absent or {}).items():
        if name not in DECLARABLE:
            problems.append(
                f"{name!r} cannot be declared absent (only {', '.join(DECLARABLE)} can): "
                "a resume cannot be exact without it"
            )
        elif name not in needed:
            problems.append(
                f"{name!r} is declared absent but the contract does not require it: "
                "leave the declaration out"
            )
        elif name in have:
            problems.append(f"{name!r} is both registered and declared absent")
        if not isinstance(why, str) or not why.strip():
            problems.append(f"{name!r}: a declaration of absence needs a reason (a string)")
    return problems


def how_to_declare(names: Iterable[str]) -> str:
    """The hint that ends an undeclared absence's message: register it, or declare why not."""
    names = list(names)
    declarable = {n: HOW[n] for n in names if n in HOW}
    text = "Register it (TrainState(..., " + ", ".join(f"{n}=..." for n in names) + "))"
    if declarable:
        text += f", or, if the loop has none, declare why: TrainState(..., absent={declarable!r})"
    return text + "."


def check_contract(
    purpose: str,
    requires: Iterable[str],
    present: Iterable[str],
    *,
    where: str,
    absent: Mapping[str, object] | None = None,
) -> None:
    """Refuse an artifact that does not hold what its own purpose requires.

    A component the artifact declares absent (``absent``: name -> reason, recorded
    in its signed statement) meets its requirement if :func:`declaration_errors`
    accepts the declaration.

    Raises:
        PurposeError: naming the missing components (or the declarations refused).
    """
    requires, present = list(requires), list(present)
    gaps = unmet(requires, present, absent)
    bad = declaration_errors(requires, present, absent)
    if gaps or bad:
        raise PurposeError(
            f"{where}: declares purpose {purpose!r} but "
            + (f"lacks {gaps}" if gaps else "")
            + ("; " if gaps and bad else "")
            + ("; ".join(bad))
            + "; it cannot serve that purpose. Re-create it with a writer that saves "
            "those components.",
            missing=gaps,
            path=where,
        )


def check_state(
    purpose: str, requires: Iterable[str], registered: Iterable[str], absent: Mapping[str, str]
) -> None:
    """Refuse, before a run starts, a state that could never write an artifact of ``purpose``.

    ``registered`` are the state's components (RNG included), ``absent`` its declarations.
    The config, provenance and lineage the checkpointer adds itself are not asked of it.

    Raises:
        ConfigError: a declaration :func:`declaration_errors` refuses.
        PurposeError: a required state component neither registered nor declared absent,
            naming it and how to declare it.
    """
    requires, registered = list(requires), list(registered)
    bad = declaration_errors(requires, registered, absent)
    if bad:
        raise ConfigError("TrainState: " + "; ".join(bad))
    gaps = [c for c in unmet(requires, registered, absent) if c not in ADDED_BY_WRITER]
    if gaps:
        raise PurposeError(
            f"TrainState: a {purpose!r} checkpoint requires {gaps}, which this state neither "
            f"registers nor declares absent. {how_to_declare(gaps)}",
            missing=gaps,
        )


def check_use(use: str, purpose: str, *, where: str, present: Iterable[str] = ()) -> None:
    """Refuse an artifact whose purpose cannot serve ``use``.

    Raises:
        PurposeError: naming the purpose found, the ones accepted, and the
            components this artifact lacks for the continuation contract.
    """
    accepted = ACCEPTS[use]
    if purpose in accepted:
        return
    best = BUILTIN[accepted[0]]
    gaps = missing(best.requires, present)
    raise PurposeError(
        f"{where}: is a {purpose!r} artifact; {use} needs {' or '.join(accepted)}"
        + (f" (it lacks {gaps})" if gaps else "")
        + ". "
        + {
            RESUME: "Use +init_from= to start a new run from its weights instead.",
            INIT: "Warm start needs training weights and the model config.",
            SERVE: "Export it with `recovery export` first.",
        }[use],
        missing=gaps,
        path=where,
    )
