"""``recovery export`` (a continuation checkpoint to a signed inference artifact) and
``recovery predict`` (serve JSON lines with one)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from json import JSONDecodeError
from pathlib import Path
from typing import Any

from recovery import errors
from recovery.cli.common import add_trust_flags, phase, trust_of
from recovery.cli.overrides import compose
from recovery.config import SigningConfig, typed
from recovery.format import bounded
from recovery.run import trackers
from recovery.run.trackers import TrackersConfig
from recovery.tools.export import admit, describe, load_inference

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
    tracked = typed(TrackersConfig, OmegaConf.select(cfg, "trackers", default=None), key="trackers")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    phase("export", f"running {node['_target_']} (verify, export, parity check)")
    code = int(exporter(cfg))
    if code == 0 and tracked.mlflow.enabled:  # the export as a model version of its run
        phase("export", "registering the artifact as a model version of its MLflow run")
        out = Path(str(OmegaConf.select(cfg, "export.out")))
        run_dir = Path(str(cfg.checkpoint.root)) / str(cfg.run.name)
        signing = typed(SigningConfig, cfg.signing, key="signing")
        trackers.register_export(tracked, signing, out, run_dir=run_dir)
    return code


def read_input(name: str | None) -> bytes:
    """The bytes of the ``--input`` file, or of stdin when there is none.

    Raises:
        CheckpointNotFoundError: no file at that path (or a directory).
        RecoveryError: the file exists but cannot be read.
    """
    if name is None:
        return sys.stdin.buffer.read()
    path = Path(name)
    if not path.is_file():
        found = "a directory" if path.is_dir() else "no such file"
        raise errors.CheckpointNotFoundError(
            f"--input {path}: expected a JSON lines file (one object per line), found {found}; "
            "check the path, or omit --input to read stdin",
            path=path,
        )
    try:
        return path.read_bytes()
    except OSError as err:
        raise errors.RecoveryError(
            f"--input {path}: cannot be read ({err.strerror}); check its permissions", path=path
        ) from None


def parse_rows(data: bytes, inputs: list[dict[str, Any]], *, where: str) -> list[dict[str, Any]]:
    """Every non-blank line of ``data``, each a JSON object whose input fields the artifact's
    signature admits (:func:`~recovery.tools.export.admit`: nothing is cast).

    Every line is checked before any is served, so bad input never yields half an output.
    Lines are numbered from 1, blank ones counted, as an editor numbers them.

    Raises:
        FormatError: naming the first bad line, its field, the value and what was expected,
            and how many other lines are bad.
    """
    names = [spec["name"] for spec in inputs]
    shape = "a JSON object like {" + ", ".join(f'"{n}": ...' for n in names) + "}"
    rows: list[dict[str, Any]] = []
    problems: list[str] = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            row = bounded.json_loads(raw)
        except ValueError as err:
            # JSONDecodeError's own text says "line 1" of the line: give the column only
            detail = f"{err.msg} at column {err.colno}" if isinstance(err, JSONDecodeError) else err
            problems.append(f"line {number}: expected {shape}, found malformed JSON ({detail})")
            continue
        if not isinstance(row, dict):
            problems.append(f"line {number}: expected {shape}, found {describe(row)}")
            continue
        absent = [n for n in names if n not in row]
        bad = [(s["name"], admit(s, row[s["name"]])) for s in inputs if s["name"] in row]
        if absent:
            problems.append(f"line {number}: field {absent[0]!r} missing; every line needs {names}")
        elif any(problem for _, problem in bad):
            name, problem = next((n, p) for n, p in bad if p)
            problems.append(f"line {number}: field {name!r}: {problem}")
        else:
            rows.append(row)
    if problems:
        n = len(problems) - 1
        more = f" ({n} more bad line{'s' if n > 1 else ''} after it)" if n else ""
        raise errors.FormatError(
            f"{where}: {problems[0]}{more}; fix the input and rerun (nothing was predicted)"
        )
    return rows


def cmd_predict(args: argparse.Namespace) -> int:
    """Serve JSON lines (``--input`` or stdin) with a verified artifact, one output line each.

    The whole input is read and checked against the artifact's signature before the
    model runs: a bad line (named by number) fails the command with no output.
    """
    data = read_input(args.input)  # a missing file is named before the artifact is loaded
    predictor = load_inference(
        Path(args.artifact), trust_of(args), allow_untrusted=args.allow_untrusted
    )
    where = f"--input {args.input}" if args.input else "stdin"
    rows = parse_rows(data, predictor.signature["inputs"], where=where)
    if not rows:
        return 0
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
    p.add_argument("artifact", help="an inference artifact directory (recovery export writes one)")
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
