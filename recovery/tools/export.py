"""Continuation checkpoint -> signed inference artifact, and the loader that serves one.

An inference artifact is a directory like a checkpoint, signed the same way,
with purpose ``inference``:

- ``model.safetensors``: the weights in serving precision (optimizer, RNG and
  sampler state stripped);
- ``preprocessing.safetensors``: what turns raw inputs into model inputs
  (for the embedding recipe: the raw user and item id tables);
- ``signature.json``: input and output names, dtypes and shapes, and how
  unknown inputs are treated;
- ``program.pt2``: a ``torch.export`` program that takes raw inputs and needs
  none of the project's code to run. torch 2.13 stores plain weights in it as
  raw bytes; its only pickle is the example inputs, which are dropped before
  saving, and :func:`check_no_pickle` refuses any archive that holds one;
- ``state.json`` and ``model.sig``.

Re-exporting the same checkpoint writes byte-identical files (no times in the
statement, deterministic signatures, a deterministic archive), so a second
``dvc repro`` has nothing to do.

The recipe supplies the serving module (:class:`ExportSpec`); this module
owns the format, the signing, the lineage and the verifying loader.
"""

from __future__ import annotations

import io
import json
import math
import numbers
import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from recovery.errors import FormatError, PurposeError
from recovery.format import bounded, codec
from recovery.format.layout import IO_SIGNATURE_FILE, PROGRAM_FILE, STATE_FILE, tensor_file
from recovery.format.manifest import Manifest
from recovery.integrity.commits import commit
from recovery.integrity.keys.signing import Signer, TrustStore
from recovery.provenance import lineage, purpose
from recovery.run.restoring import choose

PREPROCESSING = "preprocessing"
EXPORT_FORMAT = 1

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# (atol, rtol) on predictions and the absolute tolerance on the recorded metric, per dtype
TOLERANCE: dict[str, tuple[float, float, float]] = {
    "float32": (1e-5, 1e-5, 1e-4),
    "bfloat16": (5e-2, 2e-2, 2e-2),
    "float16": (5e-3, 5e-3, 5e-3),
}
# the raw values an input of each dtype its signature declares admits (see admit)
INT_RANGES: dict[str, tuple[int, int]] = {
    f"int{bits}": (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) for bits in (8, 16, 32, 64)
} | {"uint8": (0, 255)}
FLOAT_INPUTS = ("float64", "float32", "bfloat16", "float16")
# a raw value's type, in the words of the JSON it came from
KINDS = dict(bool="a boolean", int="an integer", float="a float", str="a string", list="a list")
KINDS |= {"tuple": "a list", "dict": "an object", "NoneType": "null"}


def describe(value: Any) -> str:
    """A raw value as its JSON, cut to 40 characters, and its kind: ``2144173.5 (a float)``."""
    shown = json.dumps(value, default=str)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    kind = KINDS.get(type(value).__name__, type(value).__name__)
    return shown if kind == shown else f"{shown} ({kind})"


def admit(spec: Mapping[str, Any], value: Any) -> str | None:
    """Why ``value`` cannot be one element of the input ``spec`` declares, or ``None`` if it can.

    Nothing is cast: an integer input (``int64``, ...) takes an integer (numpy's
    too) within its dtype's range, never a float (``5.0`` included) or a boolean;
    a float input takes a finite real number, never a boolean; a ``bool`` input
    takes a boolean. One value per element: a list, string or null is refused.
    """
    dtype = str(spec.get("dtype"))
    found = f"found {describe(value)}"
    is_bool = isinstance(value, bool) or type(value).__name__ == "bool_"
    if dtype in INT_RANGES:
        low, high = INT_RANGES[dtype]
        if not isinstance(value, numbers.Integral) or is_bool:
            return f"expected an integer ({dtype}), {found}"
        if not low <= int(value) <= high:
            return f"expected an integer in {dtype}'s range {low}..{high}, {found}"
        return None
    if dtype in FLOAT_INPUTS:
        if not isinstance(value, numbers.Real) or is_bool or not math.isfinite(value):
            return f"expected a finite number ({dtype}), {found}"
        return None
    if dtype == "bool":
        return None if is_bool else f"expected true or false (bool), {found}"
    return f"the signature declares dtype {dtype!r}, which no raw input can be given as"


@dataclass
class ExportSpec:
    """What a recipe hands over to be exported."""

    module: torch.nn.Module
    """The serving module: raw inputs in, outputs out, preprocessing inside, eval mode."""
    example_inputs: tuple[torch.Tensor, ...]
    dynamic_shapes: Any
    signature: dict[str, Any]
    """``{"inputs": [{name, dtype, shape}], "outputs": [...], ...}``; -1 marks a free dimension."""
    weights: dict[str, torch.Tensor]
    """Serving-precision weights (``model.safetensors``)."""
    preprocessing: dict[str, torch.Tensor] = field(default_factory=dict)


def check_no_pickle(data: bytes, *, name: str) -> None:
    """Refuse a ``torch.export`` archive that holds any pickle (or nested ``torch.save`` zip).

    Raises:
        FormatError: naming the member.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as err:
        raise FormatError(f"{name}: expected a torch.export archive (zip), found {err}") from err
    for member in archive.infolist():
        head = archive.read(member.filename)[:2]
        if head[:1] == b"\x80" or head == b"PK":
            raise FormatError(
                f"{name}: member {member.filename} holds a pickle; refusing to load it. "
                "Re-export the artifact with `recovery export`."
            )


def program_bytes(spec: ExportSpec) -> bytes:
    """The ``torch.export`` archive of the serving module, with no pickle in it."""
    program = torch.export.export(
        spec.module, spec.example_inputs, dynamic_shapes=spec.dynamic_shapes, strict=False
    )
    # the example inputs are the archive's only pickle (torch.save); serving needs none
    program._example_inputs = None
    buf = io.BytesIO()
    torch.export.save(program, buf)
    data = buf.getvalue()
    check_no_pickle(data, name=PROGRAM_FILE)
    return data


def write_artifact(
    out: Path,
    source: choose.Loaded,
    spec: ExportSpec,
    *,
    dtype: str,
    signer: Signer,
    root: Path | None = None,
) -> Manifest:
    """Write and sign the inference artifact for ``source`` at ``out`` (replacing it atomically).

    Raises:
        PurposeError: ``source`` is not a continuation checkpoint.
        CommitError: the write failed.
    """
    purpose.check_use(
        purpose.RESUME, source.manifest.purpose, where=str(source.path), present=source.components
    )
    rec = source.manifest.recovery
    skel_model, weights = codec.split(spec.weights)
    skel_pre, pre = codec.split(spec.preprocessing)
    link = lineage.link(source.manifest, source.path, root)
    meta = {
        "run_id": rec.get("run_id"),
        "metrics": source.decoded.meta.get("metrics", {}),
        "export": {
            "format": EXPORT_FORMAT,
            "dtype": dtype,
            "source": link,
            # where the source's link is relative to, from the artifact: the audit's root
            **({"root": os.path.relpath(root.absolute(), out.absolute())} if root else {}),
        },
    }
    doc = {
        "format": 1,
        "step": source.decoded.step,
        "components": {"model": skel_model, PREPROCESSING: skel_pre},
        **meta,
    }
    files: dict[str, bytes | Mapping[str, torch.Tensor]] = {tensor_file("model"): weights}
    if pre:
        files[tensor_file(PREPROCESSING)] = pre
    files[IO_SIGNATURE_FILE] = codec.dumps_json(spec.signature)
    files[PROGRAM_FILE] = program_bytes(spec)
    files[STATE_FILE] = codec.dumps_json(doc)
    lineage_list = [
        *rec.get("lineage", []),
        lineage.segment("export", str(rec.get("run_id")), source.decoded.step, link),
    ]
    present = ["model", "io_signature", "lineage", "program"] + ([PREPROCESSING] if pre else [])
    required = purpose.BUILTIN[purpose.INFERENCE].requires
    purpose.check_contract(purpose.INFERENCE, required, present, where=str(out))
    statement = {
        "step": source.decoded.step,
        "purpose": purpose.INFERENCE,
        "requires": list(required),
        "components": sorted(present),
        "run_id": rec.get("run_id"),
        "segment": len(lineage_list) - 1,
        "metrics": meta["metrics"],
        "previous": None,
        "parent": {"kind": "export", **link},
        "lineage": lineage_list,
        # the artifact carries the provenance of the run that made its weights
        "provenance": rec.get("provenance", {}),
        "export": meta["export"],
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    return commit.commit(out, files, statement, signer=signer)


class Predictor:
    """A verified inference artifact, callable on raw inputs.

    ``predictor(user_id=[...], item_id=[...])`` returns ``{output name: tensor}``.
    Raw values are checked with :func:`admit` first (nothing is cast; a bad one
    raises :class:`FormatError` naming the input and its index).
    """

    def __init__(self, path: Path, program: torch.nn.Module, signature: dict[str, Any]) -> None:
        self.path = path
        self.program = program
        self.signature = signature
        self.inputs = [spec["name"] for spec in signature["inputs"]]
        self.outputs = [spec["name"] for spec in signature["outputs"]]

    def __call__(self, **inputs: Sequence[Any] | torch.Tensor) -> dict[str, torch.Tensor]:
        missing = [n for n in self.inputs if n not in inputs]
        if missing:
            raise FormatError(
                f"{self.path}: missing inputs {missing}; the signature takes {self.inputs}"
            )
        args = []
        for spec in self.signature["inputs"]:
            name, value = spec["name"], inputs[spec["name"]]
            dtype = getattr(torch, spec["dtype"])
            if isinstance(value, torch.Tensor):
                # a float tensor into an integer input would be truncated: no silent cast
                if value.dtype.is_floating_point and not dtype.is_floating_point:
                    raise FormatError(
                        f"{self.path}: input {name}: expected a tensor of {spec['dtype']}, "
                        f"found {value.dtype}; a float is never cast to an integer input"
                    )
                args.append(value.to(dtype))
                continue
            for i, element in enumerate(value):
                problem = admit(spec, element)
                if problem is not None:
                    raise FormatError(f"{self.path}: input {name}[{i}]: {problem}")
            args.append(torch.tensor(value, dtype=dtype))
        with torch.no_grad():
            result = self.program(*args)
        values = result if isinstance(result, tuple | list) else (result,)
        return dict(zip(self.outputs, values, strict=True))


def load_inference(
    path: str | Path, trust: TrustStore | None = None, *, allow_untrusted: bool = False
) -> Predictor:
    """Verify an inference artifact, then return a callable on raw inputs.

    The signature, every file's hash and the inference contract are checked
    before the program is deserialised, from the very bytes that were hashed.

    Args:
        path: the artifact directory.
        trust: trusted keys; default: ``.recovery/trusted`` and the local dev key.
        allow_untrusted: accept another signer (the signature is still checked).

    Raises:
        VerificationError: the artifact fails verification (signature, trust, a file).
        FormatError: its verified bytes do not decode.
        PurposeError: it is no inference artifact, or lacks its program or signature.
    """
    from recovery.config import SigningConfig
    from recovery.integrity.keys import trust as trust_mod

    path = Path(path)
    store = trust if trust is not None else trust_mod.resolve_trust(SigningConfig())
    loaded = choose.load(path, store, allow_untrusted=allow_untrusted)
    purpose.check_use(
        purpose.SERVE, loaded.manifest.purpose, where=str(path), present=loaded.components
    )
    program = loaded.files.get(PROGRAM_FILE)
    signature = loaded.files.get(IO_SIGNATURE_FILE)
    if not isinstance(program, bytes) or not isinstance(signature, bytes):
        raise PurposeError(
            f"{path}: has no {PROGRAM_FILE} or {IO_SIGNATURE_FILE}", missing=["program"]
        )
    check_no_pickle(program, name=str(path / PROGRAM_FILE))
    exported = torch.export.load(io.BytesIO(program))
    try:
        io_signature = bounded.json_loads(signature)
    except ValueError as err:
        raise FormatError(f"{path / IO_SIGNATURE_FILE}: expected JSON ({err})", path=path) from err
    return Predictor(path, exported.module(), io_signature)
