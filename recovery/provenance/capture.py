"""What made a checkpoint: code, dependencies, data and config, and how they drifted.

:func:`capture` is called once per process and its result rides, signed, in
every checkpoint's statement. :func:`drift` compares two captures (and the two
configs) and returns one human-readable line per difference.

- code: git commit, branch, dirty flag, sha256 of ``git diff HEAD`` and the
  names of untracked files (gitpython); "not a git repository" is recorded as such.
- dependencies: every installed distribution as sorted ``name==version``,
  their sha256, and the sha256 of the project's lock file if it has one.
- dataset: the DVC md5 of the data directory from its ``.dvc`` file or
  ``dvc.lock``, with size and file count; else ``untracked`` with a content
  fingerprint computed here.
- config: sha256 of the resolved config with secrets redacted, the command-line
  overrides (redacted too) and which keys were redacted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from recovery.format import bounded
from recovery.provenance.dependencies import dependency_lock

log = logging.getLogger(__name__)

REDACTED = "***REDACTED***"
_SECRET = re.compile(
    r"(pass(word|wd|phrase)?|token|secret|(^|[._-])key($|[._-])|api[_-]?key|credential|"
    r"private|auth|cookie|session)",
    re.IGNORECASE,
)


def is_secret_key(key: str) -> bool:
    """Whether a config key (last dotted part) names a secret."""
    return bool(_SECRET.search(key.rsplit(".", 1)[-1]))


MIN_SECRET_LEN = 4
"""Secret values at least this long are also masked wherever else they appear (a URL, an
override); shorter ones only under their own key, lest every such substring be masked."""


def secret_values(config: Any) -> set[str]:
    """The string values under secret-looking keys, anywhere in ``config``."""
    found: set[str] = set()
    stack: list[Any] = [config]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            for k, v in node.items():
                if is_secret_key(str(k)) and isinstance(v, str) and len(v) >= MIN_SECRET_LEN:
                    found.add(v)
                else:
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(node)
    return found


def mask(text: str, secrets: set[str]) -> str:
    """``text`` with every occurrence of each secret value replaced, longest first."""
    for value in sorted(secrets, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def redact(
    config: Any, prefix: str = "", *, secrets: set[str] | None = None
) -> tuple[Any, list[str]]:
    """A copy of ``config`` with every secret removed.

    A value under a secret-looking key is replaced whole; a secret's value
    that reached any other string (``postgresql://app:${db.password}@host``
    resolved) is masked there, so the secret is in neither ``config.yaml``
    nor the signed statement.

    Returns:
        ``(redacted, dotted keys whose values were redacted or masked)``.
    """
    secrets = secret_values(config) if secrets is None else secrets
    keys: list[str] = []
    if isinstance(config, Mapping):
        out = {}
        for k, v in config.items():
            dotted = f"{prefix}.{k}" if prefix else str(k)
            if is_secret_key(str(k)) and v is not None:
                out[k] = REDACTED
                keys.append(dotted)
            else:
                out[k], sub = redact(v, dotted, secrets=secrets)
                keys += sub
        return out, keys
    if isinstance(config, list):
        items = [redact(v, f"{prefix}[{i}]", secrets=secrets) for i, v in enumerate(config)]
        return [v for v, _ in items], [k for _, ks in items for k in ks]
    if isinstance(config, str) and (masked := mask(config, secrets)) != config:
        return masked, [prefix]
    return config, keys


def redact_overrides(overrides: list[str], secrets: set[str] | None = None) -> list[str]:
    """Command-line overrides with the values of secret-looking keys replaced, and any
    secret value (``secrets``) masked in the others."""
    out = []
    for item in overrides:
        key, sep, _ = item.partition("=")
        if sep and is_secret_key(key.lstrip("+~")):
            out.append(f"{key}{sep}{REDACTED}")
        else:
            out.append(mask(item, secrets or set()))
    return out


def canonical_digest(obj: Any) -> str:
    """sha256 of the canonical JSON of ``obj``."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


DVC_BOOKKEEPING = (":(exclude,glob)**/dvc.lock", ":(exclude,glob)**/*.dvc")
"""Pathspecs of the files git's diff leaves out of the code state."""


def code_revision(root: Path, *, ignore: list[Path] | None = None) -> dict[str, Any]:
    """The git state of the repository containing ``root``.

    Untracked files under ``ignore`` (the checkpoint root: run records, DVC's
    ``.dvc`` files) and DVC bookkeeping files are not code and are left out, so
    a run's own outputs never read as a change of code.
    """
    try:
        import git
    except ImportError:  # pragma: no cover - a declared dependency
        return {"git": False, "reason": "gitpython is not installed"}
    try:
        repo = git.Repo(root, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return {"git": False, "reason": f"{root} is not in a git repository"}
    except git.GitCommandNotFound:
        return {"git": False, "reason": "the git executable was not found"}
    try:
        commit = repo.head.commit.hexsha
    except ValueError:
        return {"git": True, "commit": None, "reason": "repository has no commits", "dirty": True}
    try:
        branch: str | None = repo.active_branch.name
    except TypeError:
        branch = None  # detached HEAD
    # DVC's bookkeeping (dvc.lock, .dvc files) is rewritten by `dvc repro` and by runs
    # registering checkpoints: data versions, recorded as such, never a change of code
    diff = repo.git.diff("HEAD", "--", ".", *DVC_BOOKKEEPING, binary=True)
    top = Path(repo.working_tree_dir or root).resolve()
    skip = [str(p.resolve().relative_to(top)) + "/" for p in ignore or [] if _under(p, top)]
    untracked = sorted(
        f
        for f in repo.untracked_files
        if not f.endswith((".dvc", ".gitignore"))
        and f != "dvc.lock"
        and not any(f.startswith(prefix) for prefix in skip)
    )
    return {
        "git": True,
        "commit": commit,
        "branch": branch,
        "dirty": bool(diff) or bool(untracked),
        "diff_sha256": hashlib.sha256(diff.encode()).hexdigest() if diff else None,
        "untracked": untracked[:200],
        "untracked_count": len(untracked),
    }


def _under(path: Path, top: Path) -> bool:
    try:
        path.resolve().relative_to(top)
    except ValueError:
        return False
    return True


def _relative(data: Path, root: Path) -> str | None:
    """``data`` relative to ``root`` (posix), or ``None`` when it lies outside."""
    try:
        return data.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return None


def _dvc_out(data: Path, root: Path) -> dict[str, Any] | None:
    """The DVC record of ``data`` from ``<data>.dvc`` or ``dvc.lock``, if any."""
    sidecar = data.with_name(data.name + ".dvc")
    rel = _relative(data, root)
    if sidecar.is_file():
        doc = _dvc_yaml(sidecar)
        for out in doc.get("outs") or []:
            return {"source": f"dvc:{sidecar.name}", "target": str(sidecar), **out}
    lock = root / "dvc.lock"
    if rel is not None and lock.is_file():
        doc = _dvc_yaml(lock)
        for stage, body in (doc.get("stages") or {}).items():
            for out in body.get("outs", []):
                if out.get("path") == rel:
                    return {"source": f"dvc.lock:{stage}", "target": stage, **out}
    return None


def _dvc_yaml(path: Path) -> dict[str, Any]:
    """A DVC file's mapping; an unreadable one is reported and read as empty (provenance
    must not fail a run: the dataset is then recorded by its fingerprint alone)."""
    try:
        doc = bounded.yaml_load(path.read_text())
    except (OSError, ValueError) as err:
        log.warning("%s: cannot read it as a DVC file (%s); dataset version unknown", path, err)
        return {}
    return doc if isinstance(doc, dict) else {}


def fingerprint(data: Path) -> dict[str, Any]:
    """sha256 over every file under ``data`` (relative names and content digests), size, count."""
    h = hashlib.sha256()
    size = nfiles = 0
    files = sorted(p for p in data.rglob("*") if p.is_file()) if data.is_dir() else [data]
    for f in files:
        content = f.read_bytes()
        rel = f.relative_to(data).as_posix() if data.is_dir() else f.name
        h.update(f"{rel}\0{hashlib.sha256(content).hexdigest()}\n".encode())
        size += len(content)
        nfiles += 1
    return {"sha256": h.hexdigest(), "size": size, "nfiles": nfiles}


def dataset_version(data: Path | None, root: Path) -> dict[str, Any]:
    """The version of the data a recipe reads: DVC's md5 if tracked, else a fingerprint."""
    if data is None:
        return {"source": "none"}
    if not data.exists():
        return {"source": "missing", "path": str(data)}
    out = _dvc_out(data, root)
    if out is not None and out.get("md5"):
        from recovery.storage import dvc_status

        # DVC names outputs relative to the working directory, stages by their file
        names = {str(out.get("path")), _relative(data, root) or str(data), os.path.relpath(data)}
        stage = str(out["target"])
        target = stage if out["source"].startswith("dvc:") else f"{root / 'dvc.yaml'}:{stage}"
        status = dvc_status.data_status(root, target, names)
        record: dict[str, Any] = {
            "source": out["source"],
            "path": str(data),
            "version": f"md5:{out['md5']}",
            "md5": out["md5"],
            "size": out.get("size"),
            "nfiles": out.get("nfiles"),
            "modified": status.modified if status is not None else None,
        }
        if status is not None and status.outdated:
            # the data is what DVC recorded; what would make it has changed since
            record["stage"] = {"name": str(out["target"]), "outdated": status.outdated}
            changed = ", ".join(status.outdated)
            log.warning(
                f"the DVC stage {stage} that makes {data} is out of date (changed: {changed}); "
                f"the data itself is its DVC version md5:{out['md5']} and is recorded so. "
                f"Run `dvc repro {stage}` to remake it from the current code and config."
            )
        if record["modified"]:
            fp = fingerprint(data)
            record["version"] = f"md5:{out['md5']}+modified:sha256:{fp['sha256']}"
            log.warning(
                "dataset %s differs from its DVC version md5:%s (%s); recording it as modified. "
                "Run `dvc repro` (or `dvc checkout`) to train on a versioned dataset.",
                data,
                out["md5"],
                out["source"],
            )
        return record
    fp = fingerprint(data)
    return {"source": "untracked", "path": str(data), "version": f"sha256:{fp['sha256']}", **fp}


def capture(
    *,
    config: Mapping[str, Any],
    overrides: list[str] | None = None,
    data: Path | None = None,
    project_root: Path | None = None,
    outputs: list[Path] | None = None,
) -> dict[str, Any]:
    """Everything that made this run, captured now.

    Args:
        config: the resolved config (secrets are redacted here, never stored).
        overrides: the command-line overrides.
        data: the dataset path the run reads.
        project_root: where the code (and lock file, dvc.lock) live; default cwd.
        outputs: directories the run writes (checkpoint root, artifacts): not code.
    """
    from recovery.version import __version__

    root = project_root or Path.cwd()
    secrets = secret_values(dict(config))
    redacted, keys = redact(dict(config), secrets=secrets)
    return {
        "code": code_revision(root, ignore=outputs),
        "dependencies": dependency_lock(root),
        "dataset": dataset_version(data, root),
        "config": {
            "sha256": canonical_digest(redacted),
            "overrides": redact_overrides(list(overrides or []), secrets),
            "redacted_keys": keys,
        },
        "tool": {"name": "recovery", "version": __version__},
        "runtime": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "host": platform.node(),
            "pid": os.getpid(),
            **_threads(),
        },
    }


def _threads() -> dict[str, int]:
    """torch's intra-op thread count, when torch is loaded (a CPU reduction over another
    count sums in another order: a resume that changes it is not bit-identical)."""
    torch = sys.modules.get("torch")
    get = getattr(torch, "get_num_threads", None)
    return {"threads": int(get())} if callable(get) else {}
