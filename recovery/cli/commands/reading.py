"""The reading commands of one checkpoint: ``verify``, ``inspect``, ``audit``. They never write.

Each verifies before it shows anything: an inspection or an audit link is what
the verified bytes say, never what a file claims (``ls``, a run's table, is in
:mod:`recovery.cli.commands.listing`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recovery.cli.codes import exit_code
from recovery.cli.common import (
    LARGE,
    add_trust_flags,
    emit,
    human_size,
    load,
    parameters_digest,
    phase,
    signer_of,
    signer_text,
    size_of,
    trust_of,
)
from recovery.provenance import lineage
from recovery.run.restoring import certificate, checked, selfcheck

if TYPE_CHECKING:  # audit's walk and index: imported by the audit command only
    from recovery.tools import audit


def cmd_verify(args: argparse.Namespace) -> int:
    size = size_of(Path(args.path))
    if size >= LARGE:  # a bar shows on a terminal (recovery.progress); a line elsewhere
        phase("verify", f"reading and hashing {human_size(size)} of {args.path}")
    # every check of a resume's, no tensor decoded (recovery.run.restoring.checked): no torch
    loaded = checked.check(Path(args.path), trust_of(args), allow_untrusted=args.allow_untrusted)
    mf = loaded.manifest
    data: dict[str, Any] = {
        "path": str(loaded.path),
        "ok": True,
        "step": loaded.step,
        "purpose": mf.purpose,
        "components": loaded.components,
        "files": len(mf.files),
        "sha256": mf.root,
        "signer": checked.signer(mf),
        "delta": loaded.delta,
        "certificate": certificate.resumes(mf.recovery.get("lineage", [])),
    }
    chain = ""
    if loaded.delta is not None:
        links = loaded.delta["chain"]
        chain = f"; a delta of {loaded.delta['base']}, verified too"
        if len(links) > 1:
            chain = f"{chain} with the {len(links) - 1} below it down to the full {links[0]}"
    emit(
        args,
        data,
        "\n".join(
            [
                f"OK {loaded.path}: step {loaded.step}, purpose {mf.purpose}, "
                f"{len(mf.files)} files verified, signed by {signer_text(data['signer'])}, "
                f"sha256 {mf.root}{chain}",
                *certificate_lines(data["certificate"]),
            ]
        ),
    )
    return 0


def certificate_lines(resumes: list[dict[str, Any]]) -> list[str]:
    """The signed resume certificate: one line for all, one per resume (none: nothing)."""
    if not resumes:
        return []
    return [f"certificate: {certificate.tally(resumes)}"] + [
        "  " + certificate.line(r) for r in resumes
    ]


def delta_lines(delta: dict[str, Any] | None) -> list[str]:
    """``inspect``'s lines about a delta: its base, its place in its chain, bytes against
    the chain's full checkpoint's, and each patched table's changed rows."""
    if delta is None:
        return ["kind        full checkpoint"]
    ratio = delta["bytes"] / delta["full_bytes"] if delta["full_bytes"] else 0.0
    full = delta["chain"][0]
    return [
        f"kind        delta of {delta['base']} (step {delta['base_step']}, "
        f"sha256 {delta['base_sha256']}), link {delta['sequence']} of the chain on {full}",
        f"bytes       {delta['bytes']} ({ratio:.1%} of the full checkpoint's "
        f"{delta['full_bytes']}; the chain below it: {delta['chain_bytes']})",
        *(
            f"  changed   {key}: {changed} of {rows} rows"
            for key, (changed, rows) in sorted(delta["tables"].items())
        ),
    ]


def cmd_inspect(args: argparse.Namespace) -> int:
    from recovery.state.registry import MODEL  # torch: inspect decodes the parameters

    loaded = load(args, Path(args.path))
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
        "absent": rec.get("absent") or {},
        "hash_type": mf.hash_type,
        # each file's digest under its algorithm's name: "sha256" (the default) or "blake3"
        "files": [{"name": r.name, "size": r.size, mf.hash_type: r.digest} for r in mf.files],
        "sha256": mf.root,
        "parameters_sha256": parameters_digest(model) if isinstance(model, dict) else None,
        "metrics": decoded.meta.get("metrics", {}),
        "signer": signer_of(loaded),
        "previous": rec.get("previous"),
        "parent": rec.get("parent"),
        "code": prov.get("code"),
        "dataset": prov.get("dataset"),
        "config_sha256": prov.get("config", {}).get("sha256"),
        "delta": loaded.delta,
    }
    code = prov.get("code") or {}
    lines = [
        f"checkpoint  {loaded.path}",
        f"step        {decoded.step}",
        f"purpose     {mf.purpose}",
        f"run id      {data['run_id']}",
        f"signer      {signer_text(data['signer'])}",
        f"components  {', '.join(loaded.components)}",
        *delta_lines(loaded.delta),
        *(f"absent      {name}: {why}" for name, why in sorted(data["absent"].items())),
        f"parameters  sha256 {data['parameters_sha256']}",
        f"metrics     {json.dumps(data['metrics'], sort_keys=True)}",
        f"code        {code.get('commit') or code.get('reason')}"
        + (" (dirty)" if code.get("dirty") else ""),
        f"dataset     {(prov.get('dataset') or {}).get('version')}",
        f"sha256      {mf.root}",
        f"files:      ({mf.hash_type})",
        *(f"  {r.name:<24} {r.size:>12}  {r.digest}" for r in mf.files),
    ]
    emit(args, data, "\n".join(lines))
    return 0


def audit_text(report: audit.Report) -> str:
    """One line per link, newest first; a target or link in a run's ``abandoned/<branch>/``
    says so (the target on its own line under the first)."""
    out = [f"audit of {report.path}"]
    if report.abandoned:
        out.append(
            f"  a checkpoint of abandoned branch {report.abandoned['branch']}, moved out of "
            f"{report.abandoned['run_dir']} when the run resumed from an earlier step"
        )
    from recovery.tools import audit

    marks = {audit.OK: "[ok]    ", audit.PRUNED: "[pruned]", audit.FAILED: "[FAILED]"}
    for i, link in enumerate(report.links):
        tier = " (from the local tier)" if link.tier else ""
        arrow = "" if i == 0 else f"<- {link.relation}{tier}: "
        parts = [f"{marks[link.status]} {arrow}{link.name}", f"step {link.step}"]
        if link.purpose:
            parts.append(link.purpose)
        if link.base:
            parts.append(f"delta of {link.base['name']}")
        if link.run_id:
            parts.append(f"run {str(link.run_id)[:8]}")
        if link.status == audit.OK and link.imported:
            src = link.imported
            parts.append(f"signer {signer_text(link.signer)}")
            parts.append(
                f"imported from {src.get('kind')} {src.get('source')} (source sha256 "
                f"{str(src.get('sha256'))[:16]}), origin {src.get('origin')}"
            )
        elif link.status == audit.OK:
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
            if "+modified:" in data:
                parts.append("(modified: not its DVC version)")
            if link.dataset_stage:
                stage = link.dataset_stage
                changed = ",".join(str(c) for c in stage.get("outdated", []))
                parts.append(f"(stage {stage.get('name')} out of date: {changed})")
            if link.world_size is not None:
                parts.append(f"world {link.world_size}")
        elif link.status == audit.PRUNED:
            sha = str(link.sha256)[:16]
            if link.retired_at is not None:
                parts.append(
                    f"removed by retention at step {link.retired_at}, recorded sha256 {sha}"
                )
            else:
                parts.append(
                    f"not on disk and not retired by its run (deleted or moved by hand?), "
                    f"recorded sha256 {sha}"
                )
        if link.abandoned:
            parts.append(f"abandoned branch {link.abandoned['branch']}")
        if link.resharded:
            parts.append(
                f"resharded {link.resharded.get('from')}->{link.resharded.get('to')} ranks"
            )
        if link.drift:
            parts.append("drift since: " + ",".join(link.drift))
        if link.check:
            parts.append("resume " + selfcheck.verdict(link.check))
        out.append("  " + "  ".join(parts))
        if link.error:
            out.append(f"      error: {link.error}")
    if report.lineage:
        first = report.lineage[0]
        if first.get("kind") == lineage.IMPORT:
            source = first.get("imported") or {}
            out.append(
                f"  -- imported weights ({source.get('kind')}, {source.get('source')}): "
                "origin unverified, the source carried no signature"
            )
        else:
            out.append(f"  -- start of run {str(first.get('run_id'))[:8]} (fresh)")
        kinds = [s.get("kind") for s in report.lineage]
        out.append(
            f"segments: {len(kinds)} ({', '.join(str(k) for k in kinds)}); "
            f"links: {len(report.links)}, "
            f"verified {sum(link.status == audit.OK for link in report.links)}, "
            f"pruned {sum(link.status == audit.PRUNED for link in report.links)}, "
            f"failed {len(report.failures)}"
        )
        resumes = certificate.resumes(report.lineage)
        if resumes:
            out.append(f"certificate: {certificate.tally(resumes)}")
    out.append("result: " + ("OK" if report.ok else f"FAILED at {report.failures[0].name}"))
    return "\n".join(out)


def cmd_audit(args: argparse.Namespace) -> int:
    if args.json and args.format == "dot":
        print("error: audit: --json and --format dot are two outputs; pick one", file=sys.stderr)
        return 2
    from recovery.tools import audit
    from recovery.tools.report import lineage as report_lineage

    report = audit.audit(
        Path(args.path),
        trust_of(args),
        allow_untrusted=args.allow_untrusted,
        root=Path(args.root) if args.root else None,
    )
    if args.format == "dot":  # the report's lineage graph, for Graphviz
        graph = report_lineage.graph([report])
        print(report_lineage.dot(graph, f"lineage of {report.path}"), end="")
    else:
        emit(args, report.as_dict(), audit_text(report))
    if report.ok:
        return 0
    first = report.failures[0]
    print(f"error: audit failed at {first.name}: {first.error}", file=sys.stderr)
    return exit_code(first.exception) if first.exception else 1


def register(sub: Any) -> None:
    """Add ``verify``, ``inspect`` and ``audit`` to the subcommands."""
    p = sub.add_parser("verify", help="signature, trust, every file's hash, purpose contract")
    p.add_argument("path", help="a checkpoint or artifact directory (e.g. <run_dir>/step-00000010)")
    p.set_defaults(func=cmd_verify)
    add_trust_flags(p)
    p = sub.add_parser("inspect", help="step, purpose, signer, components, digests, provenance")
    p.add_argument("path", help="a checkpoint or artifact directory, verified before it is shown")
    p.set_defaults(func=cmd_inspect)
    add_trust_flags(p)
    p = sub.add_parser("audit", help="verify and walk the lineage back to the run's start")
    p.add_argument("path", help="the checkpoint or artifact whose lineage to walk back")
    p.add_argument(
        "--root", help="checkpoint root to find ancestors in (default: above the run dir)"
    )
    p.add_argument(
        "--format",
        choices=("text", "dot"),
        default="text",
        help="text (default), or dot: the lineage graph for Graphviz (dot -Tsvg)",
    )
    p.set_defaults(func=cmd_audit)
    add_trust_flags(p)
