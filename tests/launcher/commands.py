"""What the launcher can run: the commands it forks, and the project root whose server
runs each (:func:`root_for`); see :mod:`tests.launcher`."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("server.py")
PROFILES: dict[str, tuple[str, ...]] = {
    "core": ("torch", "torch._dynamo", "numpy", "safetensors", "yaml", "recovery"),
    "full": (
        "torch",
        "torch._dynamo",  # imported by the first optimizer a process builds: 1.7 s
        "numpy",
        "safetensors",
        "yaml",
        "recovery",
        "recovery.cli.main",
        "hydra",
        "hydra.main",
        "hydra._internal.utils",
        "hydra._internal.hydra",
        "hydra.core.utils",
        "omegaconf",
        "dvc.repo",
        "dvc.api",
        "dvc.cli",
        "sklearn.datasets",
        "matplotlib.pyplot",
        "model_signing",
        "recipes",
        # what reading or writing a torch.export program imports on first use (networkx,
        # sympy, functorch, inductor: about 3 s a process that exports or serves)
        "torch.export._trace",
        "torch.export.pt2_archive._package",
        "torch._export.serde.serialize",
        "torch._functorch.aot_autograd",
        "torch._functorch.partitioners",
        "torch._inductor.codecache",
    ),
}
# what "core" must not hold, so a script's own finder can still make them absent
CORE_ABSENT = ("dvc", "hydra", "omegaconf", "matplotlib", "sklearn")
# read by a library as it is first imported: a child of the server would not see them
# (PYTHONPATH and PYTHONUNBUFFERED the child applies itself; every other PYTHON* counts)
IMPORT_TIME_ENV = ("PYTHON", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "LD_", "TORCH_", "CUDA_")
IMPORT_TIME_ENV += ("GIT_PYTHON_", "TQDM_", "MPLBACKEND", "MALLOC_")
# applied by the child: OMP_NUM_THREADS with torch.set_num_threads, LOGLEVEL to the loggers
# torchrun's modules set from it on import (see server.py)
APPLIED_ENV = ("PYTHONPATH", "PYTHONUNBUFFERED", "OMP_NUM_THREADS", "LOGLEVEL")
# read when used, not on import, though named like the above (torchrun sets it for ranks)
READ_ON_USE_ENV = ("TORCH_NCCL_ASYNC_ERROR_HANDLING",)
TORCHRUN = "torch.distributed.run"
_BASE_ENV = dict(os.environ)
# this checkout's packages the server holds: a command that would import another copy
# of one of them is not forkable
OWN_PACKAGES = ("recovery", "recipes")
_HEADER = struct.Struct("!I")
RECORD_ENV = "TESTS_LAUNCHER_RECORD"
"""A directory: a child forked with this variable set writes ``<pid>.json`` there, its start
time and environment, which ``/proc/<pid>/environ`` does not show (a fork's shows its
server's); :func:`recorded` reads them."""


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted from the state (3)


def recorded(directory: str | os.PathLike[str]) -> dict[int, dict[str, str]]:
    """The environments of the live processes recorded in ``directory`` (:data:`RECORD_ENV`),
    by pid; a record whose pid names another process now (reused) is left out."""
    found = {}
    for path in Path(directory).glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if start_ticks(int(path.stem)) == record["start"]:
            found[int(path.stem)] = record["env"]
    return found


def _split(cmd: list[str]) -> tuple[str, str, list[str]] | None:
    """``(kind, target, args)`` of a command the server can run, or None."""
    if not cmd:
        return None
    exe = os.path.realpath(cmd[0]) if os.sep in cmd[0] else None
    if exe is None:
        return None
    if cmd[0] == sys.executable or exe == os.path.realpath(sys.executable):
        rest = cmd[1:]
        if not rest or (rest[0].startswith("-") and rest[0] not in ("-c", "-m")):
            return None  # interpreter flags: not what the server runs
        if rest[0] == "-c" and len(rest) > 1:
            return "code", rest[1], rest[2:]
        if rest[0] == "-m" and len(rest) > 1:
            # torch's own tools: fresh interpreters; but torchrun, whose ranks the server
            # starts from a zygote of the agent's (see server.py)
            if rest[1].split(".")[0] == "torch" and rest[1] != TORCHRUN:
                return None
            return "module", rest[1], rest[2:]
        if rest[0].endswith(".py"):
            return "script", rest[0], rest[1:]
        return None
    # a console script of this interpreter (recovery, dvc, model_signing)
    try:
        with open(cmd[0], "rb") as fh:
            shebang = fh.readline().strip()
    except OSError:
        return None
    if shebang == b"#!" + sys.executable.encode():
        return "script", cmd[0], cmd[1:]
    return None


# the capabilities a setpriv prefix may drop that a child drops itself (linux/capability.h)
CAPABILITIES = {"chown": 0, "dac_override": 1, "dac_read_search": 2, "fowner": 3, "fsetid": 4}


def unsetpriv(cmd: list[str]) -> tuple[list[str], list[int]]:
    """``(command, capabilities)``: the command a ``setpriv`` prefix runs and the
    capabilities it drops, when the prefix only drops capabilities of root, the same ones
    from its bounding and inheritable sets (``--bounding-set=-a,-b --inh-caps=-a,-b``:
    what a child dropping them from all its sets has, as the exec'd command would);
    otherwise ``(cmd, [])``."""
    if not cmd or os.path.basename(cmd[0]) != "setpriv" or os.geteuid() != 0:
        return cmd, []
    sets: dict[str, list[str]] = {}
    rest = cmd[1:]
    while rest and rest[0].startswith("--"):
        opt, _, value = rest.pop(0).partition("=")
        names = value.split(",")
        if opt not in ("--bounding-set", "--inh-caps") or not all(
            n.startswith("-") and n[1:] in CAPABILITIES for n in names
        ):
            return cmd, []
        sets[opt] = sorted(n[1:] for n in names)
    if len(sets) != 2 or sets["--bounding-set"] != sets["--inh-caps"] or not rest:
        return cmd, []
    return rest, [CAPABILITIES[n] for n in sets["--bounding-set"]]


def forkable(
    cmd: list[str], env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
) -> bool:
    """Whether the launcher can run ``cmd`` as a fresh interpreter would (see
    :func:`root_for`)."""
    return root_for(cmd, env, cwd) is not None


def root_for(
    cmd: list[str], env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
) -> Path | None:
    """The project root whose server can run ``cmd`` as a fresh interpreter would, or None:
    one of the forms :func:`_split` knows, no variable read at import time changed, and
    the project's packages found where the command would import them from all in one
    directory: this checkout's (:data:`ROOT`), or a copy of the project's, whose own
    server preloads the copy (a copy runs its own code: its ``__file__`` paths, its
    edits)."""
    split = _split(list(cmd))
    if split is None:
        return None
    if env is None:
        env = dict(os.environ)
    changed = {k for k, v in env.items() if _BASE_ENV.get(k) != v}
    changed |= {k for k in _BASE_ENV if k not in env}
    if any(
        k.startswith(IMPORT_TIME_ENV) and k not in APPLIED_ENV + READ_ON_USE_ENV for k in changed
    ):
        return None
    kind, target, _ = split
    here = os.path.abspath(cwd if cwd is not None else os.getcwd())
    first = os.path.dirname(os.path.realpath(os.path.join(here, target)))
    entries = [first if kind == "script" else here]
    entries += [os.path.join(here, p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    homes = set()
    for name in OWN_PACKAGES:
        for entry in entries:  # the first entry holding it is where it is imported from
            copy = os.path.join(entry, name)
            if os.path.isfile(os.path.join(copy, "__init__.py")):
                homes.add(os.path.dirname(os.path.realpath(copy)))
                break
            if os.path.isdir(copy) or os.path.exists(copy + ".py"):
                return None  # a module or namespace package of that name: not the project's
    if len(homes) > 1:
        return None  # some of the project's packages from one place, some from another
    return Path(homes.pop()) if homes else ROOT


# the words of a command that a shell runs as they are: no quoting, expansion, redirection
# or sequencing to do (and no variable assignment: no "=" in the first word)
_PLAIN_WORD = re.compile(r"[\w./=+:@%,-]+")
SHELLS = ("sh", "bash", "dash", "zsh")


def unshell(args: Any, env: dict[str, str] | None) -> list[str] | None:
    """The argv that ``[shell, *options, "-c", command]`` would run, when ``command`` is
    one simple command of plain words and its program is found on ``env``'s ``PATH``."""
    if not isinstance(args, list) or len(args) < 3 or args[-2] != "-c":
        return None
    if os.path.basename(str(args[0])) not in SHELLS:
        return None
    words = str(args[-1]).split()
    if not words or "=" in words[0] or not all(_PLAIN_WORD.fullmatch(w) for w in words):
        return None
    exe = shutil.which(words[0], path=(env if env is not None else os.environ).get("PATH"))
    return [exe, *words[1:]] if exe else None
