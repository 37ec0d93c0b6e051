"""Purposes: what an artifact is for, the components each requires, and who may load it.

An artifact declares one purpose and records that purpose's required
components in its signed statement at write time, so verifying it later needs
no config. The tables here mirror ``conf/purpose/*.yaml`` (a test keeps them
equal) so a library user without Hydra gets the same contracts.

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

from collections.abc import Iterable
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


def missing(requires: Iterable[str], present: Iterable[str]) -> list[str]:
    """Required components that are not present, in contract order."""
    have = set(present)
    return [c for c in requires if c not in have]


def check_contract(
    purpose: str, requires: Iterable[str], present: Iterable[str], *, where: str
) -> None:
    """Refuse an artifact that does not hold what its own purpose requires.

    Raises:
        PurposeError: naming the missing components.
    """
    gaps = missing(requires, present)
    if gaps:
        raise PurposeError(
            f"{where}: declares purpose {purpose!r} but lacks {gaps}; it cannot serve that "
            "purpose. Re-create it with a writer that saves those components.",
            missing=gaps,
            path=where,
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
