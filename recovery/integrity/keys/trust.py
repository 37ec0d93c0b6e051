"""Which key signs and which keys are trusted, from config and the environment.

With no key configured, the development key is found by one search order, the same
from any working directory (:mod:`recovery.integrity.keys.devkeys`), and created on first
use where a run asks (``train.py``: the working directory's ``.recovery/dev-key``,
git-ignored) or in the per-user directory. It is trusted on this machine only, and
marked as a dev key wherever a signer is shown. A run always trusts its own signer,
so it can resume what it wrote.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from recovery import access
from recovery.config import SigningConfig
from recovery.integrity import nofollow
from recovery.integrity.keys import devkeys
from recovery.integrity.keys.devkeys import DEV_KEY_ENV as DEV_KEY_ENV
from recovery.integrity.keys.devkeys import PROJECT_DEV_KEY as PROJECT_DEV_KEY
from recovery.integrity.keys.signing import (
    KEY_REMEDY,
    PRIVATE_KEY_FILE,
    PUBLIC_KEY_FILE,
    Signer,
    TrustStore,
    generate_keypair,
)

log = logging.getLogger(__name__)

KEY_ENV = "RECOVERY_SIGNING_KEY"


def dev_key_dir(
    configured: str | None = None, *, near: Iterable[Path] = (), fallback: Path | None = None
) -> Path:
    """The dev key directory: the first place of the search order
    (:func:`recovery.integrity.keys.devkeys.search`) that holds a key pair; else ``fallback``
    where given (``train.py``: its project's, so a project's runs sign with the project's
    key); else the per-user one (where a key is created when none exists)."""
    places = devkeys.search(configured, near)
    if configured or os.environ.get(DEV_KEY_ENV):
        return places[0].path  # type: ignore[return-value]  # a named place always has one
    if fallback is not None:
        places = places[:-1]  # the per-user key: for own loops, not a project's runs
    for place in places:
        if place.path is not None and (place.path / PRIVATE_KEY_FILE).exists():
            return place.path
    return fallback if fallback is not None else devkeys.user_dev_key()


def env_signer() -> Signer | None:
    """The signer ``$RECOVERY_SIGNING_KEY`` names, if set.

    Raises:
        SigningKeyError: it cannot be read or is not ECDSA.
    """
    configured = os.environ.get(KEY_ENV)
    return Signer(Path(configured)) if configured else None


def resolve_signer(
    cfg: SigningConfig, *, near: Iterable[Path] = (), create_in: Path | None = None
) -> Signer:
    """The signer: ``$RECOVERY_SIGNING_KEY``, else ``signing.key``, else the dev key the
    search order finds from ``near`` (a run directory) and the working directory.

    ``create_in`` (``train.py``: the working directory's ``.recovery/dev-key``) is the
    project's key directory: a project's runs sign with a project key found above ``near``
    or the working directory, else with one made there, never with the per-user key. With
    no ``create_in``, the per-user key is the last place, made on first use. A key made is
    registered as made on this machine (trusted from any working directory).

    Raises:
        SigningKeyError: the configured key cannot be read or is not ECDSA, or is not the
            private half of the public key beside it (:func:`paired`).
        PermissionDeniedError: a key, or the dev key's directory, this user may not read.
    """
    from_env = env_signer()
    if from_env is not None:
        return paired(from_env)
    if cfg.key:
        return paired(Signer(Path(cfg.key)))
    fallback = create_in.absolute() if create_in is not None else None
    dev_dir = dev_key_dir(cfg.dev_key_dir, near=near, fallback=fallback)
    try:
        made = (dev_dir / PRIVATE_KEY_FILE).exists()
    except PermissionError as err:  # another user's project key, say: not this run's to use
        raise access.denied(err, "the dev signing key", KEY_REMEDY) from err
    if not made:
        generate_keypair(dev_dir)
        _register(dev_dir / PUBLIC_KEY_FILE)
        log.warning(
            "created a DEV signing key in %s: it is trusted on this machine only. "
            "For shared checkpoints run `recovery keygen --out DIR` and set signing.key.",
            dev_dir,
        )
    return paired(Signer(dev_dir / PRIVATE_KEY_FILE, dev=True))


def paired(signer: Signer) -> Signer:
    """``signer``, once its private key is checked against the public key beside it
    (``recovery.pub`` next to ``recovery.key``, as ``recovery keygen`` and the dev key
    write them), which is the one trusted and registered: a private key of another pair
    would sign a whole run that no verifier accepts.

    Raises:
        SigningKeyError: the public key beside it is another key's (or unreadable).
    """
    from recovery.errors import SigningKeyError
    from recovery.integrity.keys.signing import key_id, load_public_key

    public = signer.path.with_name(PUBLIC_KEY_FILE)
    if signer.path.name != PRIVATE_KEY_FILE or not public.is_file():
        return signer
    try:
        beside = key_id(load_public_key(public.read_bytes(), where=str(public)))
    except PermissionError as err:
        raise access.denied(err, "the signing key's public half", KEY_REMEDY) from err
    except OSError as err:
        raise SigningKeyError(f"{public}: cannot read it ({err})", path=public) from err
    if beside != signer.key_id:
        raise SigningKeyError(
            f"{signer.path}: this private key is not the half of {public.name} beside it "
            f"(key {signer.key_id[:12]}, {public.name} {beside[:12]}): what it signed would "
            f"not verify against {public.name}; put the pair back together, or remove both "
            "files to make a new pair",
            path=signer.path,
        )
    return signer


def _register(public: Path) -> None:
    """Copy a dev key made here into the registry of this machine's dev keys."""
    from recovery.integrity.keys.signing import key_id, load_public_key

    pem = public.read_bytes()
    target = devkeys.registry() / f"{key_id(load_public_key(pem, where=str(public)))}.pub"
    try:
        nofollow.private_dirs(target.parent)
        target.write_bytes(pem)
        target.chmod(0o644)  # a group-writable key would be ignored (devkeys.registered_keys)
    except OSError as err:  # the key still signs; verifying elsewhere needs --trusted
        log.warning("could not register the dev key in %s: %s", target.parent, err)


def dev_key_places(configured: str | None = None) -> list[Path]:
    """The public key files trusted as dev keys: each place of the search order from the
    working directory that holds one, and the registry of this machine's dev keys. Never a
    key found above a checkpoint: one shipped beside it would vouch for itself."""
    found = [p.path / PUBLIC_KEY_FILE for p in devkeys.search(configured) if p.path]
    return [*found, *devkeys.registered_keys()]


def searched(trusted: Iterable[Path], configured: str | None = None) -> list[str]:
    """Every place a trust store built from these settings looked, in order, for messages."""
    named = ", ".join(str(Path(p).absolute()) for p in trusted)  # where, whatever the cwd
    places = [f"signing.trusted / --trusted: {named or 'none'}"]
    places += [p.text() for p in devkeys.search(configured)]
    places.append(f"dev keys made on this machine: {devkeys.registry()}")
    if os.environ.get(KEY_ENV):
        places.append(f"${KEY_ENV}: {os.environ[KEY_ENV]}")
    return places


def trust_store(trusted: Iterable[Path], configured: str | None = None) -> TrustStore:
    """Keys in ``trusted`` (files or directories), the dev keys of the search order and of
    this machine (marked dev), and the key ``$RECOVERY_SIGNING_KEY`` names; the store
    records where it looked, which an untrusted signer's message lists."""
    trusted = list(trusted)
    store = TrustStore.from_paths(trusted, dev_keys=dev_key_places(configured))
    signer = env_signer()
    if signer is not None:
        store.add_pem(signer.public_pem, source=f"${KEY_ENV} ({signer.path})")
    store.searched = searched(trusted, configured)
    return store


def resolve_trust(cfg: SigningConfig, signer: Signer | None = None) -> TrustStore:
    """:func:`trust_store` of ``signing.trusted`` and ``signing.dev_key_dir``, and
    ``signer``'s own key."""
    store = trust_store([Path(cfg.trusted)], cfg.dev_key_dir)
    if signer is not None:
        store.add_pem(signer.public_pem, source=str(signer.path), dev=signer.dev)
    return store
