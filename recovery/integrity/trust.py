"""Which key signs and which keys are trusted, from config and the environment.

With no key configured, a development key pair is created on first use in
``signing.dev_key_dir`` (git-ignored), trusted on this machine only, and marked
as a dev key wherever a signer is shown. A run always trusts its own signer,
so it can resume what it wrote.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from recovery.config import SigningConfig
from recovery.integrity.signing import (
    PRIVATE_KEY_FILE,
    PUBLIC_KEY_FILE,
    Signer,
    TrustStore,
    generate_keypair,
)

log = logging.getLogger(__name__)

KEY_ENV = "RECOVERY_SIGNING_KEY"
PROJECT_DEV_KEY = Path(".recovery") / "dev-key"
"""A project's own dev key directory, relative to where a run or command starts."""


def dev_key_dir(configured: str | None = None) -> Path:
    """Where the dev key lives: ``configured``, else the project's (``./.recovery/dev-key``)
    when it holds a key, else the per-user one under ``$XDG_CONFIG_HOME`` (default
    ``~/.config``): the same from any working directory."""
    if configured:
        return Path(configured)
    if (PROJECT_DEV_KEY / PRIVATE_KEY_FILE).exists():
        return PROJECT_DEV_KEY
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "recovery" / "dev-key"


def env_signer() -> Signer | None:
    """The signer ``$RECOVERY_SIGNING_KEY`` names, if set.

    Raises:
        SigningKeyError: it cannot be read or is not ECDSA.
    """
    configured = os.environ.get(KEY_ENV)
    return Signer(Path(configured)) if configured else None


def resolve_signer(cfg: SigningConfig) -> Signer:
    """The signer: ``$RECOVERY_SIGNING_KEY``, else ``signing.key``, else the dev key.

    Raises:
        SigningKeyError: the configured key cannot be read or is not ECDSA.
    """
    from_env = env_signer()
    if from_env is not None:
        return from_env
    if cfg.key:
        return Signer(Path(cfg.key))
    dev_dir = dev_key_dir(cfg.dev_key_dir)
    if not (dev_dir / PRIVATE_KEY_FILE).exists():
        generate_keypair(dev_dir)
        log.warning(
            "created a DEV signing key in %s: it is trusted on this machine only. "
            "For shared checkpoints run `recovery keygen --out DIR` and set signing.key.",
            dev_dir,
        )
    return Signer(dev_dir / PRIVATE_KEY_FILE, dev=True)


def resolve_trust(cfg: SigningConfig, signer: Signer | None = None) -> TrustStore:
    """Keys in ``signing.trusted``, the local dev key (marked dev), and ``signer``'s own key."""
    store = TrustStore.from_paths(
        [Path(cfg.trusted)], dev_keys=[dev_key_dir(cfg.dev_key_dir) / PUBLIC_KEY_FILE]
    )
    if signer is not None:
        store.add_pem(signer.public_pem, source=str(signer.path), dev=signer.dev)
    return store
