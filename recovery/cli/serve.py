"""``recovery export`` (a continuation checkpoint to a signed inference artifact) and
``recovery predict`` (serve JSON lines with one)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from recovery import errors
from recovery.cli.common import add_trust_flags, compose, trust_of
from recovery.tools.export import load_inference

EXPORTER_KEY = "export.exporter"


def cmd_export(args: argparse.Namespace) -> int:
    """Instantiate the exporter the config names (``export.exporter``, Hydra's ``_target_``)
    and run it on the composed config.

    The exporter is the project's code (its preprocessing and serving program),
    imported from the project root like ``python -m`` would; this package only
    provides what it builds on (:mod:`recovery.tools.export`).
    """
    cfg = compose("export", list(args.overrides))
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    node = OmegaConf.select(cfg, EXPORTER_KEY)
    if node is None or "_target_" not in node:
        raise errors.ConfigError(
            f"{EXPORTER_KEY}: expected a node with _target_ naming the project's exporter "
            "(a callable taking the composed config and returning an exit code), found "
            f"{node!r}; see conf/export/default.yaml"
        )
    root = str(Path.cwd())
    if root not in sys.path:
        sys.path.insert(0, root)
    try:
        exporter = instantiate(node, _partial_=True)
    except InstantiationException as err:
        raise errors.ConfigError(
            f"{EXPORTER_KEY}: cannot instantiate {node['_target_']!r} ({err}); run "
            "`recovery export` from the project root (where dvc.yaml is)"
        ) from err
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return int(exporter(cfg))


def cmd_predict(args: argparse.Namespace) -> int:
    predictor = load_inference(
        Path(args.artifact), trust_of(args), allow_untrusted=args.allow_untrusted
    )
    source = open(args.input) if args.input else sys.stdin  # noqa: SIM115 - closed below
    try:
        rows = [json.loads(line) for line in source if line.strip()]
    except json.JSONDecodeError as err:
        raise errors.FormatError(f"{args.input or 'stdin'}: expected JSON lines ({err})") from err
    finally:
        if args.input:
            source.close()
    if not rows:
        return 0
    missing = [n for n in predictor.inputs if any(n not in r for r in rows)]
    if missing:
        raise errors.FormatError(
            f"{args.input or 'stdin'}: every line needs {predictor.inputs}; missing {missing}"
        )
    out = predictor(**{n: [r[n] for r in rows] for n in predictor.inputs})
    for i, row in enumerate(rows):
        result = {n: row[n] for n in predictor.inputs}
        for name, values in out.items():
            value = values[i].item()
            result[name] = None if isinstance(value, float) and value != value else value
        print(json.dumps(result))
    return 0


def register(sub: Any) -> None:
    """Add ``predict`` and ``export`` to the subcommands."""
    p = sub.add_parser("predict", help="serve JSON lines of raw inputs with an inference artifact")
    p.add_argument("artifact")
    p.add_argument("--input", help="JSON lines file (default: stdin)")
    p.set_defaults(func=cmd_predict)
    add_trust_flags(p)
    p = sub.add_parser(
        "export", help="export a continuation checkpoint as a signed inference artifact"
    )
    p.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. run.name=demo export.dtype=bfloat16"
    )
    p.set_defaults(func=cmd_export)
