"""What one save *is*: a value built on the training thread at the step boundary.

A :class:`SaveJob` holds everything decided when the save was asked for (the
artifact's path, purpose and contract, the signed statement with the run's
links as of this step, the metadata, the resolved config). Writing it needs
only the state's tensors, which the strategy in :mod:`recovery.run.writing.strategies`
obtains its own way (straight from the model, from staging buffers, or per
rank). Keeping the decision a value is what lets it run on another thread
without reading the checkpointer's mutable state there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recovery.format import codec, digests
from recovery.format.manifest import FileRecord, Manifest
from recovery.integrity.commits import commit
from recovery.integrity.keys.signing import Signer
from recovery.integrity.reads import chain
from recovery.provenance import purpose
from recovery.run.status import Identity
from recovery.run.writing.differential import Plan
from recovery.state import snapshot

Tensors = dict[str, dict[str, torch.Tensor]]


def split(tree: dict[str, Any]) -> tuple[dict[str, Any], Tensors]:
    """Each component's state into its pickle-free skeleton and its tensors."""
    parts = {name: codec.split(part) for name, part in tree.items()}
    return {n: sk for n, (sk, _) in parts.items()}, {n: ts for n, (_, ts) in parts.items()}


@dataclass(frozen=True)
class SaveJob:
    """One artifact to write.

    Attributes:
        final: the committed directory's path.
        step: the step it captures.
        purpose: its purpose name; ``requires`` is that purpose's contract.
        statement: the signed statement without ``components`` (added from what is written).
        meta: ``state.json``'s run metadata (run id, metrics, model config, expectations).
        config_yaml: the resolved, redacted config.
        chained: a continuation checkpoint of the run: once committed it becomes the
            run's previous link, is retained and costed (a warm-start copy is not).
        absent: what the state declares it does not have (name -> reason), accepted
            by the contract instead of those components and signed in the statement.
        shard_bytes: components past this many tensor bytes go to shards (0: never).
        hash_type: every file's digest algorithm.
        differential: a full base or a delta of the held base (``None``: differential
            saves are off).
        faults_as: the prefix of its commit's :mod:`recovery.faults` points (``commit``;
            ``local`` for a local-tier snapshot).
    """

    final: Path
    step: int
    purpose: str
    requires: tuple[str, ...]
    statement: dict[str, Any] = field(repr=False)
    meta: dict[str, Any] = field(repr=False)
    config_yaml: str = field(repr=False)
    chained: bool = True
    absent: dict[str, str] = field(default_factory=dict)
    shard_bytes: int = 0
    hash_type: str = digests.SHA256
    differential: Plan | None = field(default=None, repr=False)
    faults_as: str = "commit"

    def write(
        self,
        skeletons: dict[str, Any],
        tensors: Tensors,
        *,
        signer: Signer,
        tmp: Path | None = None,
        adopt: Sequence[str | FileRecord] = (),
        extra_meta: dict[str, Any] | None = None,
    ) -> Manifest:
        """Encode, check the purpose contract, then commit atomically and signed.

        Args:
            tmp, adopt: a temp directory already holding files (other ranks' shards)
                and those files, to be listed and signed with the rest.
            extra_meta: metadata known only when writing (how the ranks split the state).

        Raises:
            PurposeError: what is written lacks what the purpose requires (nothing committed).
            CommitError: the commit failed; any earlier checkpoint is intact.
        """
        meta = {**self.meta, **(extra_meta or {})}
        statement = dict(self.statement)
        written = tensors
        if self.differential is not None:  # a delta: each table's changed rows only
            written, record = self.differential.encode(tensors)
            if record:
                meta[snapshot.DIFFERENTIAL] = record
                statement[chain.BASE] = record["base"]
        files = snapshot.encode_split(
            skeletons,
            written,
            step=self.step,
            meta=meta,
            config_yaml=self.config_yaml,
            shard_bytes=self.shard_bytes,
        )
        have = snapshot.present(skeletons, meta, files, statement)
        purpose.check_contract(
            self.purpose, self.requires, have, where=str(self.final), absent=self.absent
        )
        mf = commit.commit(
            self.final,
            files,
            {**statement, "components": have},
            signer=signer,
            tmp=tmp,
            adopt=adopt,
            hash_type=self.hash_type,
            faults_as=self.faults_as,
        )
        if self.differential is not None:
            self.differential.committed(self.final, mf, tensors)
        return mf


@dataclass(frozen=True)
class Carried:
    """What every artifact of this process carries, fixed when the checkpointer is built."""

    provenance: dict[str, Any] = field(repr=False)
    """This process's capture (:func:`recovery.provenance.capture.capture`)."""
    config_yaml: str = field(repr=False)
    """The resolved, redacted config."""
    model_config: dict[str, Any] | None
    """What rebuilds the model (for warm starts)."""
    world_size: int


def build(
    final: Path,
    step: int,
    *,
    purpose_name: str,
    requires: Sequence[str],
    identity: Identity,
    carried: Carried,
    metrics: dict[str, Any] | None,
    interval: dict[str, Any],
    expect: dict[str, Any] | None = None,
    chained: bool = True,
    absent: dict[str, str] | None = None,
    shard_bytes: int = 0,
    hash_type: str = digests.SHA256,
    differential: Plan | None = None,
) -> SaveJob:
    """The save of ``step`` as of now: the statement carries the run's links at this step.

    Args:
        identity: the run's id, lineage segments and the links to the previous
            artifact and the parent.
        carried: provenance (to which the drift and resharding this run segment
            resumed across are added), config, model config, world size.
        interval: the cadence's description (how the interval was chosen).
        expect: what a resume must find (the continuation contract's checks).
        absent: the state's declared absences (recorded as the statement's ``absent``).
        shard_bytes, hash_type, differential: how its files are laid out and hashed, and
            whether it is a base or a delta (see :class:`SaveJob`).
    """
    meta: dict[str, Any] = {"run_id": identity.run_id, "metrics": dict(metrics or {})}
    if carried.model_config is not None:
        meta[snapshot.MODEL_CONFIG] = carried.model_config
    if expect is not None:
        meta["expect"] = expect
    resumed_across: dict[str, Any] = {}
    if identity.drift:
        resumed_across["drift"] = identity.drift
    if identity.resharded:
        resumed_across["resharded"] = identity.resharded
    statement: dict[str, Any] = {
        "step": step,
        "purpose": purpose_name,
        "requires": list(requires),
        **({"absent": dict(absent)} if absent else {}),
        "run_id": identity.run_id,
        "segment": len(identity.lineage) - 1,
        "metrics": dict(metrics or {}),
        "previous": identity.previous,
        "parent": identity.parent,
        "lineage": list(identity.lineage),
        "provenance": {**carried.provenance, **resumed_across},
        "world_size": carried.world_size,
        "interval": interval,
        "started_at": time.time(),
    }
    return SaveJob(
        final=final,
        step=step,
        purpose=purpose_name,
        requires=tuple(requires),
        statement=statement,
        meta=meta,
        config_yaml=carried.config_yaml,
        chained=chained,
        absent=dict(absent or {}),
        shard_bytes=shard_bytes,
        hash_type=hash_type,
        differential=differential,
    )


def resumed(final: Path, mf: Manifest) -> SaveJob:
    """The save a resumed local snapshot's promotion reports: that snapshot, at ``final``."""
    return SaveJob(
        final=final,
        step=mf.step,
        purpose=mf.purpose,
        requires=tuple(mf.recovery.get("requires") or ()),
        statement=dict(mf.recovery),
        meta={},
        config_yaml="",
        hash_type=mf.hash_type,
    )
