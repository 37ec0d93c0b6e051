"""Read weights someone else wrote: a ``torch.save`` file, a Lightning ``.ckpt``, a
safetensors file, or a Hugging Face model directory.

Nothing here trusts its input. Every file is read once into memory and hashed
as read (the digests go into the imported artifact's provenance), and parsed
from those same bytes: a pickle is scanned opcode by opcode and refused if it
names a global a plain state dict does not need, before ``torch.load`` with
``weights_only=True`` sees it (:mod:`recovery.format.pickles`); a safetensors
file is checked as strictly as the official reader checks it
(:func:`recovery.format.tensorfile.views`, header bounded at 100 MiB); an
index's shard names must be plain file names in the directory. What comes out
is a flat ``{name: tensor}`` state dict, or a :class:`~recovery.errors.FormatError`
naming the file, what was expected, what was found and what to do.

A Lightning checkpoint is unpickled whole (a pickle cannot be read in part), so
one whose ``hyper_parameters`` or callback state hold objects outside the
allowlist (an OmegaConf ``DictConfig``, a ``Path``, numpy scalars) is refused,
with the way out in the message: save its ``state_dict`` alone where it is trusted.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recovery.errors import CheckpointNotFoundError, ConfigError, FormatError, UnreadableFileError
from recovery.format import bounded, pickles, tensorfile
from recovery.format.layout import SIGNATURE_FILE
from recovery.format.manifest import FileRecord

TORCH, LIGHTNING, SAFETENSORS, HF = "torch", "lightning", "safetensors", "hf"
HF_CONFIG = "config.json"
# what an HF directory may hold, in the order its loaders prefer them
HF_WEIGHTS = (
    "model.safetensors.index.json",
    "model.safetensors",
    "pytorch_model.bin.index.json",
    "pytorch_model.bin",
)
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
def _reading(path: Path) -> Iterator[None]:
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


def _read(path: Path, name: str, files: list[FileRecord]) -> bytes:
    """The bytes of ``path`` (symlinks followed: the HF cache links into its blobs), hashed
    and recorded under ``name``.

    Raises:
        CheckpointNotFoundError: nothing there. UnreadableFileError: it cannot be read.
    """
    with _reading(path):
        data = path.read_bytes()
    files.append(FileRecord(name, hashlib.sha256(data).hexdigest(), len(data)))
    return data


def _json(path: Path, name: str, files: list[FileRecord], *, what: str) -> Any:
    data = _read(path, name, files)
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


def _safetensors(path: Path, name: str, files: list[FileRecord]) -> dict[str, torch.Tensor]:
    # straight into one tensor, hashed as it arrives; the tensors are views of it
    with _reading(path):
        real = path.resolve(strict=True)  # read_hashed refuses a symlink, the HF cache has them
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
    return _file(path, path.name, [], key=key)


def _file(path: Path, name: str, files: list[FileRecord], *, key: str | None) -> Source:
    if path.suffix == ".safetensors":
        return Source(SAFETENSORS, path, _safetensors(path, name, files), files, "single")
    data = _read(path, name, files)
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


def _shard(directory: Path, name: Any, index: Path) -> Path:
    """A shard an index names: a plain file name inside ``directory``, never a path."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name or name[0] == ".":
        raise FormatError(
            f"{index}: expected shard file names inside {directory}, found {name!r}; "
            "refusing a path out of the directory"
        )
    return directory / name


def read_dir(directory: Path, *, key: str | None = None) -> Source:
    """A Hugging Face model directory: the first of :data:`HF_WEIGHTS` it holds, and its
    ``config.json`` (the artifact's model config) when there is one. Other files
    (tokenizer, generation config, ...) are not read.

    Raises:
        FormatError: none of :data:`HF_WEIGHTS`, a malformed index or shard, or shards
            whose tensors differ from what the index maps to them.
    """
    if (directory / SIGNATURE_FILE).exists():
        raise FormatError(
            f"{directory}: expected weights to import, found a recovery artifact (it holds "
            f"{SIGNATURE_FILE}); pass it to +init_from= as it is"
        )
    found = next((n for n in HF_WEIGHTS if (directory / n).is_file()), None)
    if found is None:
        with _reading(directory):
            held = sorted(p.name for p in directory.iterdir())
        shown = ", ".join(held[:6]) + (", ..." if len(held) > 6 else "") if held else "nothing"
        raise FormatError(
            f"{directory}: expected a Hugging Face model directory holding one of "
            f"{', '.join(HF_WEIGHTS)}, found {shown}; pass the weights file itself, or the "
            "directory save_pretrained() wrote"
        )
    files: list[FileRecord] = []
    tensors: dict[str, torch.Tensor] = {}
    layout = "single"
    if found.endswith(".index.json"):
        layout = "sharded"
        tensors = _sharded(directory, directory / found, files)
    elif found.endswith(".safetensors"):
        tensors = _safetensors(directory / found, found, files)
    else:
        tensors = _file(directory / found, found, files, key=key).tensors
    src = Source(HF, directory, tensors, files, layout)
    if (directory / HF_CONFIG).is_file():
        cfg = _json(directory / HF_CONFIG, HF_CONFIG, files, what="a JSON object (config.json)")
        if not isinstance(cfg, dict):
            raise FormatError(f"{directory / HF_CONFIG}: expected a JSON object, found {cfg!r}")
        src.model_config, src.config_from = cfg, HF_CONFIG
    return src


def _sharded(directory: Path, index: Path, files: list[FileRecord]) -> dict[str, torch.Tensor]:
    doc = _json(index, index.name, files, what="a JSON index with a weight_map")
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise FormatError(f"{index}: expected a JSON object with a weight_map, found {doc!r:.80}")
    wanted: dict[str, set[str]] = {}
    for name, shard in weight_map.items():
        wanted.setdefault(_shard(directory, shard, index).name, set()).add(name)
    tensors: dict[str, torch.Tensor] = {}
    for shard, names in wanted.items():
        path = directory / shard
        if not path.is_file():
            raise FormatError(
                f"{index}: names shard {shard}, which {directory} does not hold; {ADVICE}"
            )
        if shard.endswith(".safetensors"):
            got = _safetensors(path, shard, files)
        else:
            got = state_dict(pickles.load(_read(path, shard, files), name=str(path)), where=shard)
        if set(got) != names:
            extra, missing = sorted(set(got) - names), sorted(names - set(got))
            raise FormatError(
                f"{path}: expected the {len(names)} tensors {index.name} maps to it, found "
                f"{len(got)} (not in the index: {extra[:3]}, absent: {missing[:3]}); {ADVICE}"
            )
        tensors.update(got)
    return tensors
