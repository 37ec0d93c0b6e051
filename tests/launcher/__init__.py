"""A preloaded launcher: real child processes without paying the imports again.

Most of the suite's time went into fresh interpreters importing torch, Hydra, DVC and
the package (about 2.3 s each) before a test's process did anything. This module starts
one *server* per profile and test session, a fresh interpreter that imports those
modules once, computes nothing (no torch thread pool is started) and then forks a
child for each command it is sent. The child is a real process of its own:

- it has its own pid, which the test signals directly (a real SIGKILL, a real SIGTERM);
- it runs the command's script, ``-c`` code, module or console script as ``__main__``
  with the command's argv, environment (``PYTHONPATH`` included), working directory
  and standard streams (the test's own file descriptors, passed over the socket);
- it ends through the interpreter's ordinary shutdown (atexit handlers, non-daemon
  threads joined, buffers flushed), so its exit status is the one a fresh interpreter
  would give: the script's ``sys.exit`` code, 1 for an uncaught exception, or minus
  the signal that killed it. The server reaps it and sends that status back.

A ``torchrun`` job (``python -m torch.distributed.run``) is forked too: its agent runs
torchrun's own code, and starts its ranks through a *zygote*, a server of its own forked
before the agent starts a thread (see ``server.py``), so each rank is a real process in
the job's process tree, signalled by the agent as torchrun signals its workers.
A child's ``/proc/<pid>/environ`` is its server's (a fork does not rewrite it): one
started with :data:`RECORD_ENV` set records its environment where :func:`recorded`
reads it.

What a fork cannot give, and so what keeps a fresh interpreter (``subprocess``
directly): import hygiene (what importing a module pulls in), a fresh install, and
environment variables read when a library is first imported (``MKL_NUM_THREADS`` and
the like; ``OMP_NUM_THREADS`` the child applies as torch's start-up does, and
``LOGLEVEL`` as torchrun's modules do on import) —
:func:`forkable` refuses a command that sets one of those. Stochastic state that a fresh interpreter
seeds from the OS (Python's ``random``, NumPy's global generator) is reseeded in each
child; torch's default generator starts from its fixed default seed either way.

Profiles: ``full`` preloads what ``train.py``, the CLI, DVC and the recipes import;
``core`` preloads only torch and the package's core, for tests that prove a script
runs without the optional dependencies (those must stay importable-as-absent).
"""

from tests.launcher.commands import (
    _HEADER,
    CORE_ABSENT,
    OWN_PACKAGES,
    PROFILES,
    RECORD_ENV,
    ROOT,
    TORCHRUN,
    forkable,
    recorded,
    root_for,
    start_ticks,
    unsetpriv,
    unshell,
)
from tests.launcher.forked import (
    Forked,
    Popen,
    cpu_spent,
    patch,
    patch_drills,
    patch_dvc_stages,
    run,
)
from tests.launcher.servers import (
    _SERVERS,
    Server,
    close_all,
    close_copies,
    server,
    share,
)

__all__ = [
    "CORE_ABSENT",
    "OWN_PACKAGES",
    "PROFILES",
    "RECORD_ENV",
    "ROOT",
    "TORCHRUN",
    "_HEADER",
    "_SERVERS",
    "Forked",
    "Popen",
    "Server",
    "close_all",
    "close_copies",
    "cpu_spent",
    "forkable",
    "patch",
    "patch_drills",
    "patch_dvc_stages",
    "recorded",
    "root_for",
    "run",
    "server",
    "share",
    "start_ticks",
    "unsetpriv",
    "unshell",
]
