"""What every command shares: output, the trust store from flags, signer text."""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recovery import errors
from recovery.config import SigningConfig, parse_duration
from recovery.integrity.keys import trust
from recovery.integrity.keys.signing import TrustStore
from recovery.run.restoring import checked
from recovery.run.restoring.checked import signer_text as signer_text  # the commands import it here

if TYPE_CHECKING:  # imported when a command loads tensors, not to list commands
    from recovery.run.restoring import choose


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    """Print ``data`` as JSON under ``--json``, else ``text``."""
    print(json.dumps(data, indent=1, sort_keys=True, default=str) if args.json else text)


def phase(command: str, text: str) -> None:
    """One line on stderr saying what a long command is doing now (``sync: pushing 3
    checkpoints...``): stdout stays the command's result, ``--json``'s included."""
    print(f"{command}: {text}", file=sys.stderr, flush=True)


def human_size(n: int) -> str:
    """``512 B``, ``12.3 MiB``: bytes in binary units (up to TiB), one decimal."""
    power = min(4, max(0, (n.bit_length() - 1) // 10))  # the largest 1024**power <= n
    return f"{n} B" if power == 0 else f"{n / 1024**power:.1f} {'BKMGT'[power]}iB"


LARGE = 256 << 20
"""Bytes past which reading a source is slow enough to say so (:func:`phase`)."""


def size_of(path: Path) -> int:
    """Bytes of a file, or of every file under a directory (0 for nothing there)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def duration(text: str) -> float:
    """An option's duration (``60s``, ``5m``, ``24h``, ``2d``), for argparse's ``type=``: a bad
    value is a bad command line (argparse's usage line, exit 2), not a bad config (12).

    Raises:
        argparse.ArgumentTypeError: naming the value and the form expected.
    """
    try:
        return parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def durations(text: str) -> list[float]:
    """A comma-separated list of :func:`duration` values (``5m,1h,4h``), for ``type=``.

    Raises:
        argparse.ArgumentTypeError: naming the first bad item.
    """
    return [duration(item) for item in text.split(",")]


def add_trust_flags(p: argparse.ArgumentParser) -> None:
    """``--trusted`` and ``--allow-untrusted``, for every command that reads an artifact."""
    p.add_argument(
        "--trusted",
        action="append",
        metavar="PATH",
        help="trusted public key file or directory (repeatable; default .recovery/trusted); "
        "always trusted too: the dev keys ($RECOVERY_DEV_KEY_DIR, the nearest .recovery/dev-key "
        "above the working directory, ~/.config/recovery/dev-key, every dev key made on this "
        "machine: ~/.config/recovery/dev-keys/) and the key $RECOVERY_SIGNING_KEY names",
    )
    p.add_argument(
        "--allow-untrusted",
        action="store_true",
        help="accept signatures by keys outside the trust store (still checked against "
        "the key the statement carries)",
    )


def trust_of(args: argparse.Namespace) -> TrustStore:
    """The trust store ``--trusted`` names (default ``.recovery/trusted``) plus the dev keys
    (:func:`recovery.integrity.keys.trust.trust_store`)."""
    defaults = SigningConfig()
    missing = [p for p in args.trusted or [] if not Path(p).exists()]
    if missing:
        raise errors.ConfigError(
            f"--trusted {missing[0]}: no such file or directory; expected a public key file "
            "or a directory of them"
        )
    paths = [Path(p) for p in args.trusted] if args.trusted else [Path(defaults.trusted)]
    # the dev keys of the search order and of this machine, and $RECOVERY_SIGNING_KEY's key
    # (this shell's runs sign with it): the same from any working directory
    return trust.trust_store(paths)


def load(args: argparse.Namespace, path: Path) -> choose.Loaded:
    """Verify and decode ``path`` with the flags' trust settings."""
    from recovery.run.restoring import choose  # torch: only a command that decodes tensors pays it

    return choose.load(path, trust_of(args), allow_untrusted=args.allow_untrusted)


def signer_of(loaded: choose.Loaded) -> dict[str, Any] | None:
    """Who signed a verified artifact: key id, trust, dev key, where the key came from."""
    return checked.signer(loaded.manifest)


def parameters_digest(model_state: dict[str, Any]) -> str:
    """One sha256 over every model tensor: names, dtypes, shapes and raw bytes, by sorted name."""
    import torch  # only a command that hashes parameters needs it

    h = hashlib.sha256()
    for key in sorted(model_state):
        t = model_state[key]
        if not isinstance(t, torch.Tensor):
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{key}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
