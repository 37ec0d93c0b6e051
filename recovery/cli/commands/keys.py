"""``recovery keygen``: an ECDSA P-256 signing key pair."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from recovery.cli.common import emit
from recovery.integrity.keys import signing


def cmd_keygen(args: argparse.Namespace) -> int:
    priv, pub = signing.generate_keypair(Path(args.out), overwrite=args.force)
    kid = signing.pem_key_id(pub.read_bytes(), where=str(pub))
    data = {"private_key": str(priv), "public_key": str(pub), "key_id": kid}
    emit(
        args,
        data,
        f"private key {priv} (mode 0600; keep it secret)\npublic key  {pub}\nkey id      {kid}\n"
        f"sign with:  signing.key={priv}  (or RECOVERY_SIGNING_KEY={priv})\n"
        f"trust with: copy {pub.name} into the signing.trusted directory of each reader",
    )
    return 0


def register(sub: Any) -> None:
    """Add ``keygen`` to the subcommands."""
    p = sub.add_parser("keygen", help="create an ECDSA P-256 signing key pair")
    p.add_argument("--out", required=True, help="directory for recovery.key and recovery.pub")
    p.add_argument("--force", action="store_true", help="replace an existing key pair")
    p.set_defaults(func=cmd_keygen)
