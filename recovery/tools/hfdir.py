"""Read a Hugging Face model directory: its weights (one file, or the shards an index
names) and its ``config.json``, and nothing from outside it.

A directory someone hands over can hold symlinks, and a ``config.json`` that links
to ``~/.aws/credentials`` would be copied, signed, into the artifact. The one place
a model directory legitimately holds symlinks is the Hugging Face cache, where
``models--org--name/snapshots/<rev>/<file>`` links to ``../../blobs/<hash>``. So
:func:`member` follows a symlink only when the directory is such a snapshot and the
link ends in that same repository's ``blobs/`` (itself no link), at a regular file;
any other symlink (out of the directory, into another repository, into a ``blobs``
that is a link) is refused with :class:`~recovery.errors.UnsafePathError` (exit 5,
"unsafe path or symlink"), as is an index naming a shard by a path. The file
``member`` chose is then opened without following a link, so a swap after the
check is refused rather than followed. The path named on the command line is the
user's own and is taken as it is (a directory reached through a link included).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import torch

from recovery.errors import FormatError, UnsafePathError
from recovery.format import pickles
from recovery.format.layout import SIGNATURE_FILE
from recovery.format.manifest import FileRecord
from recovery.tools import sources
from recovery.tools.sources import ADVICE, HF, Source

HF_CONFIG = "config.json"
# what an HF directory may hold, in the order its loaders prefer them
HF_WEIGHTS = (
    "model.safetensors.index.json",
    "model.safetensors",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
)
CACHE_REPO = "models--"
"""How the HF cache names a model repository's directory (``models--org--name``)."""


def _mode(path: Path) -> int:
    """``path``'s own file type and mode (a link not followed); 0 when there is none."""
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def member(directory: Path, name: str) -> Path:
    """The file to open for ``name`` in the model directory ``directory`` (resolved):
    the file itself, or, when it is a symlink of the HF cache layout, the blob it
    leads to.

    Raises:
        UnsafePathError: a symlink that leads anywhere else; nothing is read from it.
        OSError: ``name`` is absent or cannot be examined (the caller maps it).
    """
    path = directory / name
    if not stat.S_ISLNK(os.lstat(path).st_mode):
        return path
    snapshots, repo = directory.parent, directory.parent.parent
    blobs = repo / "blobs"
    real = Path(os.path.realpath(path))  # the whole chain, to its end
    if (
        snapshots.name == "snapshots"
        and repo.name.startswith(CACHE_REPO)
        and stat.S_ISDIR(_mode(blobs))  # blobs/ itself no link
        and real.parent == blobs
        and stat.S_ISREG(_mode(real))
    ):
        return real
    raise UnsafePathError(
        f"{path}: expected a file, or a link into this Hugging Face cache repository's "
        f"blobs ({blobs}), found a symlink to {os.readlink(path)}; nothing was read through "
        "it; copy the file into the directory if you mean to import it",
        path=path,
    )


def _shard(directory: Path, name: Any, index: Path) -> str:
    """A shard an index names: a plain file name inside ``directory``, never a path."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name[0] == ".":
        raise UnsafePathError(
            f"{index}: expected shard file names inside {directory}, found {name!r}; "
            "refusing a path out of the directory",
            path=index,
        )
    return name


def read_dir(directory: Path, *, key: str | None = None) -> Source:
    """A Hugging Face model directory: the first of :data:`HF_WEIGHTS` it holds, and its
    ``config.json`` (the artifact's model config) when there is one. Other files
    (tokenizer, generation config, ...) are not read.

    Raises:
        FormatError: none of :data:`HF_WEIGHTS`, a malformed index or shard, or shards
            whose tensors differ from what the index maps to them.
        UnsafePathError: a symlink out of the cache layout (:func:`member`), or a shard
            named by a path.
    """
    if (directory / SIGNATURE_FILE).exists():
        raise FormatError(
            f"{directory}: expected weights to import, found a recovery artifact (it holds "
            f"{SIGNATURE_FILE}); pass it to +init_from= as it is"
        )
    found = next((n for n in HF_WEIGHTS if (directory / n).is_file()), None)
    if found is None:
        with sources.reading(directory):
            held = sorted(p.name for p in directory.iterdir())
        shown = ", ".join(held[:6]) + (", ..." if len(held) > 6 else "") if held else "nothing"
        raise FormatError(
            f"{directory}: expected a Hugging Face model directory holding one of "
            f"{', '.join(HF_WEIGHTS)}, found {shown}; pass the weights file itself, or the "
            "directory save_pretrained() wrote"
        )
    with sources.reading(directory):
        real = directory.resolve(strict=True)
    files: list[FileRecord] = []
    layout = "single"
    if found.endswith(".index.json"):
        layout = "sharded"
        tensors = _sharded(directory, real, found, files)
    else:
        tensors = _weights(directory, real, found, files, key=key)
    src = Source(HF, directory, tensors, files, layout)
    if (directory / HF_CONFIG).is_file():
        cfg = _json(directory, real, HF_CONFIG, files, what="a JSON object (config.json)")
        if not isinstance(cfg, dict):
            raise FormatError(f"{directory / HF_CONFIG}: expected a JSON object, found {cfg!r}")
        src.model_config, src.config_from = cfg, HF_CONFIG
    return src


def _json(directory: Path, real: Path, name: str, files: list[FileRecord], *, what: str) -> Any:
    path = directory / name
    with sources.reading(path):
        opened = member(real, name)
    return sources.read_json(path, name, files, what=what, real=opened)


def _weights(
    directory: Path, real: Path, name: str, files: list[FileRecord], *, key: str | None
) -> dict[str, torch.Tensor]:
    """One weights file of the directory: safetensors by its name, else a torch.save file."""
    path = directory / name
    with sources.reading(path):
        opened = member(real, name)
    if name.endswith(".safetensors"):
        return sources.read_safetensors(path, name, files, real=opened)
    return sources.read_torch(path, name, files, key=key, real=opened).tensors


def _sharded(
    directory: Path, real: Path, index_name: str, files: list[FileRecord]
) -> dict[str, torch.Tensor]:
    index = directory / index_name
    doc = _json(directory, real, index_name, files, what="a JSON index with a weight_map")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise FormatError(f"{index}: expected a JSON object with a weight_map, found {doc!r:.80}")
    wanted: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        wanted.setdefault(_shard(directory, shard, index), set()).add(name)
    tensors: dict[str, torch.Tensor] = {}
    for shard, names in wanted.items():
        path = directory / shard
        if not path.is_file():
            raise FormatError(
                f"{index}: names shard {shard}, which {directory} does not hold; {ADVICE}"
            )
        if shard.endswith(".safetensors"):
            got = _weights(directory, real, shard, files, key=None)
        else:
            with sources.reading(path):
                opened = member(real, shard)
            data = sources.read_bytes(path, shard, files, real=opened)
            got = sources.state_dict(pickles.load(data, name=str(path)), where=shard)
        if set(got) != names:
            extra, missing = sorted(set(got) - names), sorted(names - set(got))
            raise FormatError(
                f"{path}: expected the {len(names)} tensors {index.name} maps to it, found "
                f"{len(got)} (not in the index: {extra[:3]}, absent: {missing[:3]}); {ADVICE}"
            )
        tensors.update(got)
    return tensors
