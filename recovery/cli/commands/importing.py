"""``recovery import``: existing weights -> a signed warm-start artifact for ``+init_from=``.

The library (:mod:`recovery.tools.importing`) reads, checks and commits; this
module resolves the signer as every writing command does (``$RECOVERY_SIGNING_KEY``,
else the dev key) and reports what was read and what was written.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from recovery.cli.common import LARGE, emit, human_size, phase, size_of
from recovery.config import SigningConfig
from recovery.integrity.keys import trust
from recovery.tools import importing


def cmd_import(args: argparse.Namespace) -> int:
    signer = trust.resolve_signer(SigningConfig())
    size = size_of(Path(args.src))
    if size >= LARGE:  # a large model takes a while to read, hash, convert and sign
        phase("import", f"reading {args.src} ({human_size(size)}): hash, convert, write, sign")
    result = importing.import_weights(
        Path(args.src),
        Path(args.out),
        signer=signer,
        key=args.key,
        strip_prefix=args.strip_prefix,
        model_config=Path(args.model_config) if args.model_config else None,
    )
    rec = result.record
    entry = f", entry {rec['key']!r}" if rec["key"] else ""
    lines = [
        f"imported {args.src} ({rec['kind']}{entry}, {rec['tensors']} tensors, "
        f"{human_size(rec['bytes'])}) -> {result.path}",
        f"  source sha256 {rec['sha256']} over {len(rec['files'])} file(s) read: "
        + ", ".join(f"{f['name']} {f['sha256'][:12]}" for f in rec["files"]),
    ]
    if rec["strip_prefix"]:
        dropped = rec["dropped_count"]
        shown = ", ".join(rec["dropped"][:5]) + (", ..." if dropped > 5 else "")
        lines.append(
            f"  kept the names under {rec['strip_prefix']!r}, without it"
            + (f"; dropped {dropped} others: {shown}" if dropped else "")
        )
    origin = rec["model_config_from"]
    lines.append(
        "  model_config from "
        + (origin if origin != "none" else "nowhere: the source has none (--model-config FILE)")
    )
    lines += [
        f"  signed by {signer.key_id[:12]}{' (dev key)' if signer.dev else ''}, sha256 "
        f"{result.manifest.root}; origin {rec['origin']}: the source carried no signature",
        f"  warm start with: python train.py +init_from={result.path}",
    ]
    emit(args, result.as_dict(), "\n".join(lines))
    return 0


def register(sub: Any) -> None:
    """Add ``import`` to the subcommands."""
    p = sub.add_parser(
        "import",
        help="a torch.save file, Lightning .ckpt, safetensors file or HF directory -> a "
        "signed warm-start artifact",
    )
    p.add_argument("src", help="the weights: a file, or a Hugging Face model directory")
    p.add_argument("--out", required=True, help="the artifact directory to create")
    p.add_argument(
        "--key",
        help="the entry of a pickled mapping that holds the state dict "
        "(default: state_dict when there is one, else the whole file)",
    )
    p.add_argument(
        "--strip-prefix",
        metavar="PREFIX",
        help="keep only the tensors whose names start with PREFIX (e.g. model.), without it",
    )
    p.add_argument(
        "--model-config",
        metavar="FILE",
        help="a JSON file to record as the model config (default: the source's config.json "
        "or Lightning hyper_parameters)",
    )
    p.set_defaults(func=cmd_import)
