"""``recovery``: the command-line entry point. The only module that prints or exits.

``main(argv) -> int`` parses, runs one subcommand and maps any
:class:`~recovery.errors.RecoveryError` to one message line on stderr and a
distinct exit code per error class (:data:`EXIT_CODES`, listed in README.md).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from recovery import errors
from recovery.config import SigningConfig, parse_duration
from recovery.format.layout import scan
from recovery.integrity import signing
from recovery.integrity.signing import PUBLIC_KEY_FILE, TrustStore
from recovery.run import policy, resume
from recovery.state.registry import MODEL
from recovery.storage import tracking
from recovery.tools import audit, drill
from recovery.tools.export import load_inference

# Most specific first: the first isinstance match decides the code.
EXIT_CODES: list[tuple[type[BaseException], int, str]] = [
    (errors.CheckpointNotFoundError, 3, "checkpoint not found"),
    (errors.ManifestError, 4, "manifest missing or malformed (uncommitted or damaged)"),
    (errors.UnsafePathError, 5, "unsafe path or symlink"),
    (errors.MissingFileError, 6, "a listed file is missing"),
    (errors.ExtraFileError, 7, "an unlisted file is present"),
    (errors.TruncatedFileError, 8, "a file has the wrong size"),
    (errors.DigestMismatchError, 9, "a file's sha256 does not match"),
    (errors.SignatureError, 16, "signature bundle malformed or signature invalid"),
    (errors.UntrustedSignerError, 17, "signer not in the trust store"),
    (errors.VerificationError, 15, "verification failed"),
    (errors.PurposeError, 18, "artifact's purpose cannot serve the requested use"),
    (errors.DriftError, 19, "strict resume refused: code, dependencies, data or config changed"),
    (errors.SigningKeyError, 20, "signing key unreadable or unsupported"),
    (errors.TrackingError, 21, "DVC could not register, push or fetch a checkpoint"),
    (
        errors.Preempted,
        75,
        "preempted: checkpointed at the step boundary, requeue with +resume=latest",
    ),
    (errors.ExportError, 22, "export failed its parity check; no artifact was left"),
    (errors.DrillError, 23, "a drill or preflight found that recovery does not reproduce the run"),
    (errors.FormatError, 10, "verified bytes do not decode"),
    (errors.IncompatibleStateError, 11, "checkpoint does not fit this run"),
    (errors.ConfigError, 12, "invalid configuration"),
    (errors.RunDirInUseError, 13, "fresh run into a run directory with checkpoints"),
    (errors.CommitError, 14, "checkpoint could not be committed"),
    (errors.RecoveryError, 1, "other recovery error"),
]


def exit_code(err: BaseException) -> int:
    """The exit code for an error (1 for anything unlisted)."""
    for cls, code, _ in EXIT_CODES:
        if isinstance(err, cls):
            return code
    return 1


def report(err: BaseException) -> int:
    """Print one line for ``err`` on stderr and return its exit code."""
    label = "preempted" if isinstance(err, errors.Preempted) else "error"
    print(f"{label}: {err}", file=sys.stderr)
    return exit_code(err)


def parameters_digest(model_state: dict[str, Any]) -> str:
    """One sha256 over every model tensor: names, dtypes, shapes and raw bytes, by sorted name."""
    h = hashlib.sha256()
    for key in sorted(model_state):
        t = model_state[key]
        if not isinstance(t, torch.Tensor):
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{key}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=1, sort_keys=True, default=str) if args.json else text)


def _trust(args: argparse.Namespace) -> TrustStore:
    defaults = SigningConfig()
    paths = [Path(p) for p in args.trusted] if args.trusted else [Path(defaults.trusted)]
    return TrustStore.from_paths(paths, dev_keys=[Path(defaults.dev_key_dir) / PUBLIC_KEY_FILE])


def _load(args: argparse.Namespace, path: Path) -> resume.Loaded:
    return resume.load(path, _trust(args), allow_untrusted=args.allow_untrusted)


def signer_text(signer: dict[str, Any] | None) -> str:
    """``63f7f2ef1a2b (dev key, trusted)``."""
    if not signer:
        return "unsigned"
    tags = [
        t for t, on in (("dev key", signer.get("dev")), ("trusted", signer.get("trusted"))) if on
    ]
    if not signer.get("trusted"):
        tags.append("UNTRUSTED")
    return f"{str(signer.get('key_id'))[:12]} ({', '.join(tags)})"


def _signer(loaded: resume.Loaded) -> dict[str, Any] | None:
    check = loaded.manifest.signer
    if check is None:
        return None
    dev = check.dev or bool((loaded.manifest.recovery.get("signer") or {}).get("dev"))
    return {"key_id": check.key_id, "trusted": check.trusted, "dev": dev, "source": check.source}


def cmd_verify(args: argparse.Namespace) -> int:
    loaded = _load(args, Path(args.path))
    mf = loaded.manifest
    data: dict[str, Any] = {
        "path": str(loaded.path),
        "ok": True,
        "step": loaded.decoded.step,
        "purpose": mf.purpose,
        "components": loaded.components,
        "files": len(mf.files),
        "sha256": mf.root,
        "signer": _signer(loaded),
    }
    _emit(
        args,
        data,
        f"OK {loaded.path}: step {loaded.decoded.step}, purpose {mf.purpose}, "
        f"{len(mf.files)} files verified, signed by {signer_text(data['signer'])}, "
        f"sha256 {mf.root}",
    )
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    loaded = _load(args, Path(args.path))
    mf, decoded = loaded.manifest, loaded.decoded
    rec = mf.recovery
    model = decoded.tree.get(MODEL)
    prov = rec.get("provenance", {})
    data = {
        "path": str(loaded.path),
        "step": decoded.step,
        "purpose": mf.purpose,
        "run_id": rec.get("run_id"),
        "components": loaded.components,
        "files": [{"name": r.name, "size": r.size, "sha256": r.sha256} for r in mf.files],
        "sha256": mf.root,
        "parameters_sha256": parameters_digest(model) if isinstance(model, dict) else None,
        "metrics": decoded.meta.get("metrics", {}),
        "signer": _signer(loaded),
        "previous": rec.get("previous"),
        "parent": rec.get("parent"),
        "code": prov.get("code"),
        "dataset": prov.get("dataset"),
        "config_sha256": prov.get("config", {}).get("sha256"),
    }
    code = prov.get("code") or {}
    lines = [
        f"checkpoint  {loaded.path}",
        f"step        {decoded.step}",
        f"purpose     {mf.purpose}",
        f"run id      {data['run_id']}",
        f"signer      {signer_text(data['signer'])}",
        f"components  {', '.join(loaded.components)}",
        f"parameters  sha256 {data['parameters_sha256']}",
        f"metrics     {json.dumps(data['metrics'], sort_keys=True)}",
        f"code        {code.get('commit') or code.get('reason')}"
        + (" (dirty)" if code.get("dirty") else ""),
        f"dataset     {(prov.get('dataset') or {}).get('version')}",
        f"sha256      {mf.root}",
        "files:",
        *(f"  {r.name:<24} {r.size:>12}  {r.sha256}" for r in mf.files),
    ]
    _emit(args, data, "\n".join(lines))
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise errors.CheckpointNotFoundError(f"{run_dir}: no such run directory", path=run_dir)
    listing = scan(run_dir)
    trust = _trust(args)
    dvc_state = tracking.status(run_dir)
    in_repo = tracking.find_repo(run_dir) is not None
    rows: list[dict[str, Any]] = []
    for step, path in listing.committed:
        st = dvc_state.get(path.name, tracking.Status())
        dvc = (
            "pushed"
            if st.pushed
            else "registered"
            if st.registered
            else "pending"
            if in_repo
            else "-"
        )
        row: dict[str, Any] = {
            "step": step,
            "path": str(path),
            "purpose": None,
            "size": 0,
            "dvc": dvc,
        }
        try:
            loaded = resume.load(path, trust, allow_untrusted=args.allow_untrusted)
            row.update(
                purpose=loaded.manifest.purpose,
                size=sum(r.size for r in loaded.manifest.files),
                verified=True,
                status="ok",
                signer=_signer(loaded),
                loss=loaded.decoded.meta.get("metrics", {}).get("loss"),
            )
        except errors.RecoveryError as err:
            row.update(verified=False, status=type(err).__name__, error=str(err))
        rows.append(row)
    for path in listing.stale:
        rows.append({"step": None, "path": str(path), "verified": False, "status": "partial"})
    on_disk = {step for step, _ in listing.committed}
    for step, path in sorted(tracking.tracked_steps(run_dir).items()):
        if step not in on_disk:
            rows.append(
                {
                    "step": step,
                    "path": str(path),
                    "verified": False,
                    "status": "remote-only",
                    "dvc": "registered",
                }
            )
    lines = [
        f"{'step':>10}  {'purpose':<13} {'size':>10}  {'verified':<8}  {'signer':<32}  "
        f"{'dvc':<10}  status"
    ]
    for r in rows:
        step_txt = str(r["step"]) if r["step"] is not None else "-"
        signer = signer_text(r.get("signer")) if r.get("signer") else "-"
        lines.append(
            f"{step_txt:>10}  {r.get('purpose') or '-':<13} {r.get('size', 0):>10}  "
            f"{'yes' if r['verified'] else 'NO':<8}  {signer:<32}  {r.get('dvc', '-'):<10}  "
            f"{r['status']}  {Path(r['path']).name}"
        )
    _emit(args, {"run_dir": str(run_dir), "checkpoints": rows}, "\n".join(lines))
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    root = tracking.find_repo(run_dir)
    if root is None or not run_dir.is_dir():
        raise errors.TrackingError(
            f"{run_dir}: not a run directory inside a DVC repository (run `dvc init` at the "
            "project root)",
            path=run_dir,
        )
    state = tracking.status(run_dir)
    todo = [
        path
        for _, path in scan(run_dir).committed
        if not state.get(path.name, tracking.Status()).registered
        or (args.push and not state.get(path.name, tracking.Status()).pushed)
    ]
    publisher = tracking.Publisher(root, push=args.push, remote=args.remote)
    for path in todo:
        publisher.submit(path)
    done = publisher.close(parse_duration(args.timeout))
    after = tracking.status(run_dir)
    left = [
        p.name
        for p in todo
        if not after.get(p.name, tracking.Status()).registered
        or (args.push and not after.get(p.name, tracking.Status()).pushed)
    ]
    data = {
        "run_dir": str(run_dir),
        "synced": [p.name for p in todo if p.name not in left],
        "pending": left,
    }
    _emit(
        args,
        data,
        f"synced {len(data['synced'])}, still pending {len(left)}"
        + (f": {', '.join(left)}" if left else ""),
    )
    if left or not done:
        raise errors.TrackingError(
            f"{run_dir}: {len(left)} checkpoint(s) still pending ({', '.join(left)}); "
            "is the DVC repository locked or the remote unreachable?",
            path=run_dir,
        )
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    try:
        recipe_export = importlib.import_module("recipes.export")
    except ImportError as err:
        raise errors.ConfigError(
            f"export: cannot import the project's recipes ({err}); run `recovery export` from "
            "the project root (where dvc.yaml is)"
        ) from err
    return int(recipe_export.main(list(args.overrides)))


def cmd_predict(args: argparse.Namespace) -> int:
    predictor = load_inference(
        Path(args.artifact), _trust(args), allow_untrusted=args.allow_untrusted
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


def cmd_drill(args: argparse.Namespace) -> int:
    if args.preflight:
        result = drill.preflight(Path(args.preflight), _trust(args))
        _emit(
            args,
            result,
            f"preflight OK {result['path']}: step {result['step']}, lr {result['lr']}, "
            f"next batch of {result['next_batch_size']} reproduced",
        )
        return 0
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    conf = Path.cwd() / "conf"
    if not conf.is_dir():
        raise errors.ConfigError(
            "drill: run it from the project root (where conf/ and train.py are)"
        )
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = compose(config_name="config", overrides=list(args.overrides))
    level = str(OmegaConf.select(cfg, "drill.level", default="bitwise"))
    if level not in ("bitwise", "tolerance"):
        raise errors.ConfigError(f"drill.level: expected bitwise or tolerance, got {level!r}")
    out = Path(args.out or f".recovery/drills/{time.strftime('%Y%m%d-%H%M%S')}")
    plan = drill.Plan(
        script=Path(args.script),
        overrides=[
            o for o in args.overrides if not o.startswith(("checkpoint.root=", "run.name="))
        ],
        steps=int(cfg.train.steps),
        every=int(cfg.checkpoint.every_steps),
        out=out,
        level=level,
        atol=float(OmegaConf.select(cfg, "drill.atol", default=0.0)),
        rtol=float(OmegaConf.select(cfg, "drill.rtol", default=0.0)),
        dvc=args.dvc,
    )
    report = drill.run(
        plan,
        kills=args.kills,
        seed=args.seed,
        trust=lambda: _trust(args),
        allow_untrusted=args.allow_untrusted,
    )
    reached = sum(k["reached"] for k in report.kills)
    lines = [
        f"drill of {args.script} {' '.join(args.overrides)}: {reached} kills "
        f"({', '.join(k['point'] for k in report.kills)}), resumed at {report.resumes}",
        f"level {report.level}: "
        + (
            "PASS: the drilled run equals the uninterrupted run"
            if report.passed
            else f"FAIL: {len(report.differences)} differences"
        ),
        *(f"  {d}" for d in report.differences[:20]),
        f"report {out / drill.DRILL_FILE}, plot {report.plot}, {report.seconds:.0f}s",
    ]
    _emit(args, {**report.__dict__, "out": str(out)}, "\n".join(lines))
    if not report.passed:
        raise errors.DrillError(
            f"drill failed: {len(report.differences)} differences, first: {report.differences[0]}"
        )
    return 0


def cmd_keygen(args: argparse.Namespace) -> int:
    priv, pub = signing.generate_keypair(Path(args.out), overwrite=args.force)
    kid = signing.key_id(pub.read_bytes())
    data = {"private_key": str(priv), "public_key": str(pub), "key_id": kid}
    _emit(
        args,
        data,
        f"private key {priv} (mode 0600; keep it secret)\npublic key  {pub}\nkey id      {kid}\n"
        f"sign with:  signing.key={priv}  (or RECOVERY_SIGNING_KEY={priv})\n"
        f"trust with: copy {pub.name} into the signing.trusted directory of each reader",
    )
    return 0


def audit_text(report: audit.Report) -> str:
    """One line per link, newest first."""
    out = [f"audit of {report.path}"]
    marks = {audit.OK: "[ok]    ", audit.PRUNED: "[pruned]", audit.FAILED: "[FAILED]"}
    for i, link in enumerate(report.links):
        arrow = "" if i == 0 else f"<- {link.relation}: "
        parts = [f"{marks[link.status]} {arrow}{link.name}", f"step {link.step}"]
        if link.purpose:
            parts.append(link.purpose)
        if link.run_id:
            parts.append(f"run {str(link.run_id)[:8]}")
        if link.status == audit.OK:
            code = link.code or {}
            parts.append(f"signer {signer_text(link.signer)}")
            commit = code.get("commit")
            parts.append(
                "code "
                + (str(commit)[:10] if commit else "not-git")
                + (" dirty" if code.get("dirty") else "")
            )
            data = str(link.dataset)
            parts.append(f"data {data[:23] + '…' if len(data) > 24 else data}")
            if link.world_size is not None:
                parts.append(f"world {link.world_size}")
        elif link.status == audit.PRUNED:
            parts.append(
                f"not on disk (deleted by retention), recorded sha256 {str(link.sha256)[:16]}"
            )
        if link.resharded:
            parts.append(
                f"resharded {link.resharded.get('from')}->{link.resharded.get('to')} ranks"
            )
        if link.drift:
            parts.append("drift since: " + ",".join(link.drift))
        out.append("  " + "  ".join(parts))
        if link.error:
            out.append(f"      error: {link.error}")
    if report.lineage:
        first = report.lineage[0]
        out.append(f"  -- start of run {str(first.get('run_id'))[:8]} (fresh)")
        kinds = [s.get("kind") for s in report.lineage]
        out.append(
            f"segments: {len(kinds)} ({', '.join(str(k) for k in kinds)}); "
            f"links: {len(report.links)}, "
            f"verified {sum(link.status == audit.OK for link in report.links)}, "
            f"pruned {sum(link.status == audit.PRUNED for link in report.links)}, "
            f"failed {len(report.failures)}"
        )
    out.append("result: " + ("OK" if report.ok else f"FAILED at {report.failures[0].name}"))
    return "\n".join(out)


def cmd_audit(args: argparse.Namespace) -> int:
    report = audit.audit(
        Path(args.path),
        _trust(args),
        allow_untrusted=args.allow_untrusted,
        root=Path(args.root) if args.root else None,
    )
    _emit(args, report.as_dict(), audit_text(report))
    if report.ok:
        return 0
    first = report.failures[0]
    print(f"error: audit failed at {first.name}: {first.error}", file=sys.stderr)
    return exit_code(first.exception) if first.exception else 1


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        cost = parse_duration(args.cost)
        mtbf = parse_duration(args.mtbf)
        intervals = [parse_duration(t) for t in args.intervals.split(",")]
    except ValueError as err:
        raise errors.ConfigError(f"plan: {err}") from None
    best = policy.young_daly(cost, mtbf)
    rows = policy.plan(cost, mtbf, sorted({*intervals, best}))
    optimum = min(rows, key=lambda r: r["total_per_day_s"])
    for row in rows:
        row["optimum"] = row is optimum
        row["young_daly"] = row["interval_s"] == best
    header = (
        f"checkpoint cost C = {_dur(cost)}, MTBF = {_dur(mtbf)}; "
        f"Young/Daly optimum sqrt(2*C*MTBF) = {_dur(best)}\n"
        f"{'interval':>10}  {'lost/failure':>12}  {'ckpt cost/day':>13}  "
        f"{'failure loss/day':>16}  {'total/day':>10}"
    )
    lines = [header]
    for r in rows:
        mark = "  <- optimum" if r["optimum"] else ""
        lines.append(
            f"{_dur(r['interval_s']):>10}  {_dur(r['loss_per_failure_s']):>12}  "
            f"{_dur(r['checkpoint_cost_per_day_s']):>13}  {_dur(r['failure_loss_per_day_s']):>16}  "
            f"{_dur(r['total_per_day_s']):>10}{mark}"
        )
    _emit(
        args, {"cost_s": cost, "mtbf_s": mtbf, "young_daly_s": best, "rows": rows}, "\n".join(lines)
    )
    return 0


def _dur(seconds: float) -> str:
    """``45s``, ``12.5m``, ``3.2h``."""
    if seconds < 120:
        return f"{seconds:.3g}s"
    if seconds < 7200:
        return f"{seconds / 60:.3g}m"
    return f"{seconds / 3600:.3g}h"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recovery",
        description="Verify, inspect, audit and list signed exact-resume training checkpoints.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    reading = []
    p = sub.add_parser("ls", help="table of a run's checkpoints, each verified, with signer")
    p.add_argument("run_dir", help="<checkpoint.root>/<run.name>")
    p.set_defaults(func=cmd_ls)
    reading.append(p)
    p = sub.add_parser("verify", help="signature, trust, every file's hash, purpose contract")
    p.add_argument("path")
    p.set_defaults(func=cmd_verify)
    reading.append(p)
    p = sub.add_parser("inspect", help="step, purpose, signer, components, digests, provenance")
    p.add_argument("path")
    p.set_defaults(func=cmd_inspect)
    reading.append(p)
    p = sub.add_parser("audit", help="verify and walk the lineage back to the run's start")
    p.add_argument("path")
    p.add_argument(
        "--root", help="checkpoint root to find ancestors in (default: above the run dir)"
    )
    p.set_defaults(func=cmd_audit)
    reading.append(p)
    p = sub.add_parser("drill", help="kill-and-resume drill (or --preflight PATH)")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for the drilled training run")
    p.add_argument("--kills", type=int, default=10, help="SIGKILLs at random points (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed for choosing the kill points")
    p.add_argument("--out", help="where the runs, drill.json and drill.png go")
    p.add_argument("--script", default="train.py", help="the training script (default train.py)")
    p.add_argument("--preflight", metavar="PATH", help="check one real checkpoint instead")
    p.add_argument(
        "--dvc",
        action="store_true",
        help="drill in a throwaway git+DVC repository, pushing, with kills during registration",
    )
    p.set_defaults(func=cmd_drill)
    reading.append(p)
    p = sub.add_parser("predict", help="serve JSON lines of raw inputs with an inference artifact")
    p.add_argument("artifact")
    p.add_argument("--input", help="JSON lines file (default: stdin)")
    p.set_defaults(func=cmd_predict)
    reading.append(p)
    for p in reading:
        p.add_argument(
            "--trusted",
            action="append",
            metavar="PATH",
            help="trusted public key file or directory (repeatable; default .recovery/trusted; "
            "the local dev key in .recovery/dev-key is always trusted)",
        )
        p.add_argument(
            "--allow-untrusted",
            action="store_true",
            help="accept signatures by keys outside the trust store (still checked against "
            "the key the statement carries)",
        )
    p = sub.add_parser("plan", help="checkpoint interval arithmetic: cost vs expected loss")
    p.add_argument("--cost", required=True, help="cost of one checkpoint to the run, e.g. 60s")
    p.add_argument("--mtbf", required=True, help="mean time between failures, e.g. 24h")
    p.add_argument(
        "--intervals",
        default="5m,10m,30m,1h,2h,4h,8h",
        help="comma-separated intervals to compare (the optimum is always added)",
    )
    p.set_defaults(func=cmd_plan)
    p = sub.add_parser(
        "export", help="export a continuation checkpoint as a signed inference artifact"
    )
    p.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. run.name=demo export.dtype=bfloat16"
    )
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("sync", help="register (and push) every checkpoint DVC has not got yet")
    p.add_argument("run_dir")
    p.add_argument("--push", action="store_true", help="also push to the remote")
    p.add_argument("--remote", default=None, help="DVC remote name (default: the default remote)")
    p.add_argument("--timeout", default="10m", help="give up after this long (e.g. 90s, 10m)")
    p.set_defaults(func=cmd_sync)
    p = sub.add_parser("keygen", help="create an ECDSA P-256 signing key pair")
    p.add_argument("--out", required=True, help="directory for recovery.key and recovery.pub")
    p.add_argument("--force", action="store_true", help="replace an existing key pair")
    p.set_defaults(func=cmd_keygen)
    for action in sub.choices.values():
        action.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``recovery`` subcommand; return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except errors.RecoveryError as err:
        return report(err)


def main_entry() -> None:
    """Console-script wrapper around :func:`main`."""
    sys.exit(main())


if __name__ == "__main__":
    main_entry()
