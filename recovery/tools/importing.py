"""Bring existing weights in: a source :mod:`recovery.tools.sources` reads -> a signed
warm-start artifact that ``+init_from=`` and ``Checkpointer.restore(init_from=)`` accept.

The artifact is written exactly as a run's own warm-start copy is (a
:class:`~recovery.run.writing.job.SaveJob` of purpose ``warm_start``: ``model.safetensors``,
``state.json`` with the model config, ``config.yaml``, ``model.sig``), with
step 0 and one lineage segment of kind ``import``. Its provenance says what
it is: ``imported`` records the source (kind, path, the sha256 and size of
every file read, their root digest, the entry and prefix chosen, the keys
dropped) and ``origin: unverified``. The signature vouches that *this tool*
read *those bytes*; nothing vouches for who produced them, and the audit says so.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from recovery.errors import CheckpointNotFoundError, ConfigError, FormatError
from recovery.format import bounded
from recovery.format.manifest import Manifest, root_digest
from recovery.integrity.keys.signing import Signer
from recovery.provenance import capture, lineage, purpose
from recovery.run.status import Identity
from recovery.run.writing import job as job_mod
from recovery.state import wrapping
from recovery.state.registry import MODEL
from recovery.tools import hfdir, sources
from recovery.tools.sources import Source
from recovery.version import __version__

log = logging.getLogger(__name__)

UNVERIFIED = "unverified"
"""``imported.origin``: the source carried no signature this tool could check."""
MAX_DROPPED_LISTED = 50


@dataclass
class Imported:
    """What an import wrote."""

    path: Path
    manifest: Manifest
    source: Source = field(repr=False)
    record: dict[str, Any]
    """The provenance's ``imported`` entry."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "sha256": self.manifest.root,
            "purpose": self.manifest.purpose,
            "signer": (self.manifest.recovery.get("signer") or {}).get("key_id"),
            "imported": self.record,
        }


def read(src: Path, *, key: str | None = None) -> Source:
    """The weights at ``src``: a directory (Hugging Face layout) or one file.

    Raises:
        CheckpointNotFoundError: nothing at ``src``.
        FormatError, ConfigError, UnreadableFileError: as :mod:`recovery.tools.sources`.
        UnsafePathError: a directory's symlink or shard path leads out of it
            (:mod:`recovery.tools.hfdir`).
    """
    if src.is_dir():
        return hfdir.read_dir(src, key=key)
    if not src.exists():
        raise CheckpointNotFoundError(
            f"{src}: no such file or directory to import; expected a torch.save file, a "
            "Lightning .ckpt, a .safetensors file or a Hugging Face model directory",
            path=src,
        )
    return sources.read_file(src, key=key)


def strip(
    tensors: dict[str, torch.Tensor], prefix: str | None, *, where: Path
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Keep the tensors under ``prefix`` (a Lightning module's ``model.``), without it.

    Returns:
        The kept tensors, and the names of those not under ``prefix`` (dropped, and
        recorded as such: nothing is left out unsaid).

    Raises:
        ConfigError: no name starts with ``prefix`` (the prefixes that do exist named).
    """
    if not prefix:
        return tensors, []
    kept = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix) and k != prefix}
    if not kept:
        tops = sorted({k.split(".", 1)[0] + "." for k in tensors})[:8]
        raise ConfigError(
            f"{where}: --strip-prefix {prefix!r}: no tensor name starts with it; the names "
            f"start with {tops}",
            path=where,
        )
    kept_names = {prefix + n for n in kept}
    return kept, sorted(k for k in tensors if k not in kept_names)


def _model_config(src: Source, path: Path | None) -> tuple[dict[str, Any], str]:
    """The artifact's model config and where it came from: ``path`` (a JSON object), else
    the source's own (``config.json``, Lightning's ``hyper_parameters``), else a record
    that there was none (the warm-start contract requires the entry, never a guess)."""
    if path is None:
        if src.model_config is not None:
            return src.model_config, str(src.config_from)
        return {"imported": src.kind, "config": None}, "none"
    try:
        doc = bounded.json_loads(path.read_bytes(), limit=sources.MAX_JSON)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"--model-config {path}: expected a readable JSON object, found {err}", path=path
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"--model-config {path}: expected a JSON object, found {doc!r:.60}")
    return doc, str(path)


def _runtime() -> dict[str, Any]:
    return {"python": sys.version.split()[0], "platform": platform.platform()}


def import_weights(
    src: Path,
    out: Path,
    *,
    signer: Signer,
    key: str | None = None,
    strip_prefix: str | None = None,
    model_config: Path | None = None,
) -> Imported:
    """Read ``src`` (:func:`read`), and commit its weights at ``out`` as a signed warm-start
    artifact (``out`` must not exist; its parent is created).

    Args:
        key: the entry of a pickled mapping holding the state dict (default ``state_dict``
            when there is one).
        strip_prefix: keep only the tensors under this prefix, without it (:func:`strip`).
        model_config: a JSON file recorded as the model config instead of the source's own.

    Raises:
        ConfigError: ``out`` exists, ``--key``/``--strip-prefix``/``--model-config`` do
            not fit. CheckpointNotFoundError, FormatError, UnreadableFileError: the source.
        CommitError: the artifact could not be written (nothing is left at ``out``).
    """
    if os.path.lexists(out):
        raise ConfigError(
            f"--out {out}: already exists; expected a new directory for the artifact; "
            "remove it or choose another --out",
            path=out,
        )
    source = read(src, key=key)
    tensors, dropped = strip(source.tensors, strip_prefix, where=src)
    tensors = wrapping.canonical(tensors)  # a compiled or DDP model's names, unwrapped
    config, config_from = _model_config(source, model_config)
    options = {"source": str(src), "key": source.key, "strip_prefix": strip_prefix}
    record: dict[str, Any] = {
        "kind": source.kind,
        "layout": source.layout,
        "source": str(src.resolve()),
        "sha256": root_digest(source.files),
        "files": [{"name": r.name, "sha256": r.digest, "size": r.size} for r in source.files],
        "key": source.key,
        "strip_prefix": strip_prefix,
        "dropped": dropped[:MAX_DROPPED_LISTED],
        "dropped_count": len(dropped),
        "tensors": len(tensors),
        "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
        "model_config_from": config_from,
        "origin": UNVERIFIED,
        "imported_at": time.time(),
    }
    run_id = uuid.uuid4().hex
    summary = {k: record[k] for k in ("kind", "source", "sha256", "origin")}
    identity = Identity(
        run_id=run_id, lineage=[lineage.segment(lineage.IMPORT, run_id, 0, None, imported=summary)]
    )
    settings = {"import": options}
    carried = job_mod.Carried(
        provenance={
            "imported": record,
            "config": {"sha256": capture.canonical_digest(settings)},
            "tool": {"name": "recovery", "version": __version__},
            "runtime": _runtime(),
        },
        config_yaml=yaml.safe_dump(settings, sort_keys=False),
        model_config=config,
        world_size=1,
    )
    job = job_mod.build(
        out,
        0,
        purpose_name=purpose.WARM_START,
        requires=purpose.BUILTIN[purpose.WARM_START].requires,
        identity=identity,
        carried=carried,
        metrics=None,
        interval={},
        chained=False,
    )
    skeletons, split = job_mod.split({MODEL: tensors})
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        mf = job.write(skeletons, split, signer=signer)
    except FormatError as err:  # e.g. a dtype safetensors cannot store
        raise FormatError(f"{src}: cannot be stored as safetensors: {err}", path=src) from err
    log.info("imported %s (%s) as %s", src, source.kind, out)
    return Imported(out, mf, source, record)
