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


def resolve_signer(cfg: SigningConfig) -> Signer:
    """The signer: ``$RECOVERY_SIGNING_KEY``, else ``signing.key``, else the dev key.

    Raises:
        SigningKeyError: the configured key cannot be read or is not ECDSA.
    """
    configured = os.environ.get(KEY_ENV) or cfg.key
    if configured:
        return Signer(Path(configured))
    dev_dir = Path(cfg.dev_key_dir)
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
        [Path(cfg.trusted)], dev_keys=[Path(cfg.dev_key_dir) / PUBLIC_KEY_FILE]
    )
    if signer is not None:
        store.add_pem(signer.public_pem, source=str(signer.path), dev=signer.dev)
    return store
