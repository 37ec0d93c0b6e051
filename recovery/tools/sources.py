"""Read weights someone else wrote: a ``torch.save`` file, a Lightning ``.ckpt``, a
safetensors file, or a Hugging Face model directory.

Nothing here trusts its input. Every file is read once into memory and hashed
as read (the digests go into the imported artifact's provenance), and parsed
from those same bytes: a pickle is scanned opcode by opcode and refused if it
names a global a plain state dict does not need, or states tensors the file's
storages do not hold, before ``torch.load`` with ``weights_only=True`` sees it
(:mod:`recovery.format.pickles`); a safetensors file is checked as strictly as
the official reader checks it (:func:`recovery.format.tensorfile.views`, header
bounded at 100 MiB). A Hugging Face directory is read by
:mod:`recovery.tools.hfdir`, which follows a symlink only into the HF cache's
blobs. What comes out is a flat ``{name: tensor}`` state dict, or a
:class:`~recovery.errors.FormatError` naming the file, what was expected, what
was found and what to do.

A Lightning checkpoint is unpickled whole (a pickle cannot be read in part), so
one whose ``hyper_parameters`` or callback state hold objects outside the
allowlist (an OmegaConf ``DictConfig``, a ``Path``, numpy scalars) is refused,
with the way out in the message: save its ``state_dict`` alone where it is trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recovery.errors import CheckpointNotFoundError, ConfigError, FormatError, UnreadableFileError
from recovery.format import bounded, pickles, tensorfile
from recovery.format.manifest import FileRecord

TORCH, LIGHTNING, SAFETENSORS, HF = "torch", "lightning", "safetensors", "hf"
MAX_JSON = 64 << 20
"""Largest ``config.json`` or index read (an index lists every tensor name once)."""
LIGHTNING_KEYS = ("pytorch-lightning_version", "global_step", "epoch")
ADVICE = "fetch or export the source again"


@dataclass
class Source:
    """Weights read from one source, and what was read to get them."""

    kind: str
    """torch, lightning, safetensors or hf."""
    path: Path
    tensors: dict[str, torch.Tensor]
    files: list[FileRecord] = field(default_factory=list)
    """Every file read, in order (names relative to a directory source)."""
    layout: str = ""
    """zip or legacy (a pickle), single or sharded (safetensors / HF)."""
    key: str | None = None
    """The entry of a torch/Lightning file the state dict came from (``None``: the whole)."""
    model_config: dict[str, Any] | None = None
    config_from: str | None = None
    """Where ``model_config`` came from: config.json, hyper_parameters."""


@contextmanager
def reading(path: Path) -> Iterator[None]:
    """Map the OS's refusals to typed errors naming ``path``."""
    try:
        yield
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"{path}: no such file to import", path=path) from None
    except OSError as err:
        raise UnreadableFileError(
            f"{path}: expected a readable file, found {err.strerror or err}; check its permissions",
            path=path,
        ) from None


def read_bytes(
    path: Path, name: str, files: list[FileRecord], *, real: Path | None = None, limit: int = 0
) -> bytes:
    """The bytes of one regular file, hashed and recorded under ``name``: ``path`` (symlinks
    followed: the file the user named), or ``real`` without following one (a directory's
    member, resolved by :func:`recovery.tools.hfdir.member`). ``limit``: most bytes read.

    Raises:
        CheckpointNotFoundError: nothing there. UnreadableFileError: it cannot be read.
        FormatError: not a regular file (a FIFO, a device), or larger than ``limit``.
    """
    nofollow = 0 if real is None else os.O_NOFOLLOW
    flags = os.O_RDONLY | os.O_NONBLOCK | nofollow  # a FIFO must not block the open
    with reading(path), open(os.open(real or path, flags), "rb") as fh:
        info = os.fstat(fh.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise FormatError(f"{path}: expected a regular file, found another kind", path=path)
        if limit and info.st_size > limit:
            raise FormatError(
                f"{path}: expected at most {limit} bytes, found {info.st_size}; {ADVICE}",
                path=path,
            )
        data = fh.read()
    files.append(FileRecord(name, hashlib.sha256(data).hexdigest(), len(data)))
    return data


def read_json(
    path: Path, name: str, files: list[FileRecord], *, what: str, real: Path | None = None
) -> Any:
    """A JSON document of at most :data:`MAX_JSON` bytes, read as :func:`read_bytes` reads."""
    data = read_bytes(path, name, files, real=real, limit=MAX_JSON)
    try:
        return bounded.json_loads(data, limit=MAX_JSON)
    except ValueError as err:
        raise FormatError(f"{path}: expected {what}, found {err}; {ADVICE}", path=path) from None


def state_dict(obj: Any, *, where: str) -> dict[str, torch.Tensor]:
    """``obj`` as a flat state dict: string names to dense tensors of dtypes we can store.

    Raises:
        FormatError: naming the first entry that is not, and the way to pick a nested one.
    """
    if not isinstance(obj, Mapping):
        raise FormatError(
            f"{where}: expected a state dict (a mapping of names to tensors), found "
            f"{type(obj).__name__}; save model.state_dict() and import that"
        )
    bad = [(k, v) for k, v in obj.items() if not isinstance(k, str) or not _storable(v)]
    if bad:
        k, v = bad[0]
        found = type(v).__name__ if not isinstance(v, torch.Tensor) else _tensor_kind(v)
        if not isinstance(k, str):
            found = f"a {type(k).__name__} name"
        nested = isinstance(v, Mapping) and any(isinstance(x, torch.Tensor) for x in v.values())
        hint = (
            f"the weights may be under it: choose it with `recovery import --key {k}`"
            if nested
            else "save model.state_dict() alone and import that"
        )
        raise FormatError(
            f"{where}: expected a state dict of tensors, found entry {k!r}: {found} "
            f"({len(bad)} of {len(obj)} entries are not named tensors safetensors can store); "
            f"{hint}"
        )
    if not obj:
        raise FormatError(f"{where}: expected a state dict of tensors, found an empty mapping")
    return dict(obj)


def _storable(v: Any) -> bool:
    return (
        isinstance(v, torch.Tensor) and v.layout == torch.strided and v.dtype in tensorfile.DTYPES
    )


def _tensor_kind(t: torch.Tensor) -> str:
    return f"a {t.layout} tensor" if t.layout != torch.strided else f"a {t.dtype} tensor"


def read_safetensors(
    path: Path, name: str, files: list[FileRecord], *, real: Path | None = None
) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors, checked; ``real`` as :func:`read_bytes` takes it."""
    # straight into one tensor, hashed as it arrives; the tensors are views of it
    with reading(path):
        real = real or path.resolve(strict=True)  # read_hashed refuses a symlink
        buffer, digest = tensorfile.read_hashed(real, size=real.stat().st_size)
    files.append(FileRecord(name, digest, buffer.numel()))
    tensors = tensorfile.views(buffer, name=str(path), advice=ADVICE)
    return state_dict(tensors, where=str(path))


def read_file(path: Path, *, key: str | None = None) -> Source:
    """A single file: safetensors by its suffix, else a ``torch.save`` pickle (Lightning
    when it is a ``.ckpt`` or carries Lightning's keys beside ``state_dict``).

    ``key`` picks the state dict inside a pickled mapping; by default a ``state_dict``
    entry when there is one (Lightning), else the whole file.

    Raises:
        FormatError, ConfigError (``key`` absent), CheckpointNotFoundError, UnreadableFileError.
    """
    return read_torch(path, path.name, [], key=key)


def read_torch(
    path: Path, name: str, files: list[FileRecord], *, key: str | None, real: Path | None = None
) -> Source:
    """A weights file as :func:`read_file` reads it, recorded under ``name`` in ``files``;
    ``real`` as :func:`read_bytes` takes it."""
    if path.suffix == ".safetensors":
        tensors = read_safetensors(path, name, files, real=real)
        return Source(SAFETENSORS, path, tensors, files, "single")
    data = read_bytes(path, name, files, real=real)
    obj = pickles.load(data, name=str(path))  # scans every pickle first
    layout = "zip" if data[:2] == b"PK" else "legacy"
    lightning = path.suffix == ".ckpt" or (
        isinstance(obj, Mapping) and "state_dict" in obj and any(k in obj for k in LIGHTNING_KEYS)
    )
    chosen = key if key is not None else ("state_dict" if _has(obj, "state_dict") else None)
    if chosen is not None:
        if not _has(obj, chosen):
            keys = sorted(str(k) for k in obj)[:8] if isinstance(obj, Mapping) else []
            raise ConfigError(
                f"{path}: --key {chosen}: no such entry; expected one of {keys}", path=path
            )
        inner = obj[chosen]
    elif lightning:
        raise FormatError(
            f"{path}: expected a Lightning checkpoint holding state_dict, found none; "
            "choose the entry with --key"
        )
    else:
        inner = obj
    where = f"{path}" + (f"[{chosen!r}]" if chosen is not None else "")
    src = Source(LIGHTNING if lightning else TORCH, path, state_dict(inner, where=where), files)
    src.layout, src.key = layout, chosen
    hp = obj.get("hyper_parameters") if lightning and isinstance(obj, Mapping) else None
    if isinstance(hp, Mapping) and hp and _json_able(hp):
        src.model_config, src.config_from = dict(hp), "hyper_parameters"
    return src


def _has(obj: Any, key: str) -> bool:
    return isinstance(obj, Mapping) and key in obj


def _json_able(obj: Any) -> bool:
    try:
        json.dumps(obj, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
