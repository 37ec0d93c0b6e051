"""What changed since a checkpoint: one line per difference between two provenance
captures (:mod:`recovery.provenance.capture`) and their configs, the ``DRIFT`` a resume
reports before it loads anything, and the config keys that are no drift."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

# Keys that say how a process was started, how strictly to load or where its checkpoints
# are also kept (DVC registration and push), not what run it is: a key or any key under it.
VOLATILE_KEYS = frozenset(
    {
        "resume",
        "init_from",
        "checkpoint.strict_resume",
        "signing.allow_untrusted",
        "checkpoint.dvc",
    }
)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> leaf value."""
    if isinstance(config, Mapping):
        out: dict[str, Any] = {}
        for k, v in config.items():
            out |= flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return out
    return {prefix: config}


def drift(
    old: Mapping[str, Any],
    new: Mapping[str, Any],
    *,
    old_config: Mapping[str, Any] | None = None,
    new_config: Mapping[str, Any] | None = None,
) -> list[str]:
    """One line per difference between two provenance captures (and configs).

    Config keys are compared after redaction; :data:`VOLATILE_KEYS` are ignored.
    """
    lines: list[str] = []
    oc, nc = old.get("code", {}), new.get("code", {})
    if oc.get("commit") != nc.get("commit"):
        lines.append(f"code: commit {_short(oc.get('commit'))} -> {_short(nc.get('commit'))}")
    if oc.get("diff_sha256") != nc.get("diff_sha256") or oc.get("untracked") != nc.get("untracked"):
        lines.append(
            "code: uncommitted changes differ (dirty "
            f"{oc.get('dirty')} diff {_short(oc.get('diff_sha256'))} -> "
            f"dirty {nc.get('dirty')} diff {_short(nc.get('diff_sha256'))})"
        )
    od, nd = old.get("dependencies", {}), new.get("dependencies", {})
    if od.get("sha256") != nd.get("sha256"):
        before = dict(p.split("==", 1) for p in od.get("packages", []))
        after = dict(p.split("==", 1) for p in nd.get("packages", []))
        changes = [
            f"{n} {before.get(n, '(absent)')} -> {after.get(n, '(absent)')}"
            for n in sorted(before.keys() | after.keys())
            if before.get(n) != after.get(n)
        ]
        lines.append("dependencies: " + ("; ".join(changes[:20]) or "package set changed"))
    if (od.get("lock_file") or {}).get("sha256") != (nd.get("lock_file") or {}).get("sha256"):
        lines.append("dependencies: lock file changed")
    ot, nt = old.get("runtime", {}).get("threads"), new.get("runtime", {}).get("threads")
    if ot is not None and nt is not None and ot != nt:
        lines.append(
            f"torch threads: {ot} -> {nt} (on CPU a reduction over another thread count sums "
            "in another order: not bit-identical; train.threads or OMP_NUM_THREADS sets it)"
        )
    ov, nv = old.get("dataset", {}).get("version"), new.get("dataset", {}).get("version")
    if ov != nv:
        lines.append(f"dataset: {ov} -> {nv}")
    if old_config is not None and new_config is not None:
        a = {k: v for k, v in flatten(old_config).items() if not _volatile(k)}
        b = {k: v for k, v in flatten(new_config).items() if not _volatile(k)}
        for key in sorted(a.keys() | b.keys()):
            if a.get(key, "(absent)") != b.get(key, "(absent)"):
                lines.append(
                    f"config: {key}: {a.get(key, '(absent)')!r} -> {b.get(key, '(absent)')!r}"
                )
    elif old.get("config", {}).get("sha256") != new.get("config", {}).get("sha256"):
        lines.append("config: changed")
    return lines


def _volatile(key: str) -> bool:
    parts = key.split(".")
    return any(".".join(parts[:n]) in VOLATILE_KEYS for n in range(1, len(parts) + 1))


def _short(value: Any) -> str:
    return str(value)[:12] if value else str(value)


def config_change(lines: Sequence[str], key: str) -> tuple[Any, Any] | None:
    """``(before, after)`` when :func:`drift`'s ``lines`` say config ``key`` changed (the
    values as the line writes them: Python literals); ``None`` otherwise."""
    head = f"config: {key}: "
    for line in lines:
        if line.startswith(head):
            before, _, after = line[len(head) :].partition(" -> ")
            try:
                return ast.literal_eval(before), ast.literal_eval(after)
            except (ValueError, SyntaxError):
                return None
    return None
