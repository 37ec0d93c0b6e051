"""What DVC says of a tracked dataset: is the data what DVC recorded, and is the stage
that makes it up to date? Two questions, answered apart.

``dvc status`` of a stage mixes its changed dependencies and its changed outputs, so a
changed dependency used to read as changed *data* (every run after a stale
``dvc.lock`` signed its dataset as modified). :func:`status_of` reads DVC's status
shapes as a pure function (its table test holds DVC 3.67's shapes); :func:`data_status`
asks DVC, and compares the workspace itself where DVC did not ("not in cache").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recovery.storage.tracking import _quiet, _repo, log


@dataclass(frozen=True)
class DataStatus:
    """What DVC says of one tracked dataset: two separate questions."""

    modified: bool
    """The data itself differs from the hash DVC recorded for it (its outputs changed,
    were deleted, or are not recorded yet)."""
    outdated: list[str]
    """What changed in the stage that makes it (its dependencies, its command): the
    stage is out of date, and ``dvc repro`` would remake the data, which may or may not
    come out the same. Empty for a ``.dvc`` file or an up-to-date stage."""
    unknown: bool = False
    """DVC did not compare the data (its recorded hash is not in the cache): the caller
    must (:func:`data_status` does)."""


DATA_CHANGED = frozenset({"modified", "deleted", "new"})
"""DVC's states of an output whose workspace content is not what it recorded."""
NOT_IN_CACHE = "not in cache"
"""DVC's state of an output whose recorded hash is not in the cache: DVC says so before it
compares the workspace, so the workspace is then compared here."""
STAGE_CHANGED = frozenset({"changed command", "changed checksum"})
"""DVC's plain-string entries of a stage (or ``.dvc`` file) whose record itself changed."""


def data_status(root: Path, target: str, out: Iterable[str]) -> DataStatus | None:
    """How the output ``out`` (its names: relative to ``root``, or as the ``.dvc`` file
    lists it) of ``target`` (a stage name or a ``.dvc`` file) stands against DVC's record;
    ``None`` when DVC cannot tell.

    DVC's status of a stage mixes changed dependencies and changed outputs; a dataset
    is *modified* only when its output differs from the recorded hash.
    """
    names = set(out)
    try:
        with _quiet():
            repo = _repo(root)
            try:
                # no network: an imported dataset's source is not asked at every start
                status = repo.status(targets=[target], check_updates=False)
                result = status_of(status, names)
                if result.unknown:  # "not in cache": compare the workspace with the record
                    changed = [
                        o.changed_checksum()
                        for stage in repo.stage.collect(target)
                        for o in stage.outs
                        if o.def_path in names or str(o) in names
                    ]
                    result = DataStatus(any(changed), result.outdated)
            finally:
                repo.close()
    except Exception as err:  # provenance must not fail a run
        log.warning("could not ask DVC whether %s changed: %s", target, err)
        return None
    return result


def status_of(status: dict[str, Any], out: Iterable[str]) -> DataStatus:
    """:class:`DataStatus` of the output named ``out`` from ``dvc status``'s mapping (a pure
    function: its table test holds DVC's shapes)."""
    names = set(out)
    modified, unknown, outdated = False, False, []
    for entries in status.values():
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, str) and entry in STAGE_CHANGED:  # DVC lists these as strings
                outdated.append("cmd" if entry == "changed command" else "checksum")
            if not isinstance(entry, dict):
                continue
            for path, state in (entry.get("changed outs") or {}).items():
                if path in names and state in DATA_CHANGED:
                    modified = True
                unknown = unknown or (path in names and state == NOT_IN_CACHE)
            outdated += sorted(entry.get("changed deps") or {})
    return DataStatus(modified, outdated, unknown and not modified)
