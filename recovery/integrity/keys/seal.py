"""Sealed journal events: the records that steer a resume, signed and chained.

The journal (``metrics.jsonl``) is a plain file in the run directory, and a
few of its records decide what a resume does: ``start``/``warm_start``/``resume``
name the run (a planted checkpoint of another run is found by them),
``checkpoint`` says which steps the run committed (a deleted newest one is a
rollback), ``retired`` says which ones it deleted on purpose (and so hides a
rollback) and ``abandoned`` moves checkpoints aside. Whoever can append a line
could steer a resume; so each of these *steering* events is sealed when it is
written:

- ``prev``: the link (sha256 of the canonical JSON) of the sealed event before it
  in the file, ``""`` for the first, so an event cannot be removed, reordered or
  copied in from another journal without breaking the chain;
- ``auth``: ``{"key": <key id>, "sig": <base64 DER ECDSA>}``, the run's signing
  key over ``DOMAIN`` + the canonical JSON of everything else in the record.

A reader (:func:`check`) obeys a steering event only if its signature verifies
with a trusted key *and* its ``prev`` is the link of the last event it obeyed;
anything else (unsigned, signed by another key, altered, out of the chain) is
returned as :class:`Refused`, for the caller to warn loudly about and ignore.
Ignoring is the safe direction for every event but ``checkpoint``: forgetting
a commit would hide a rollback. So a ``checkpoint`` event whose signature
verifies but whose chain was broken (one altered byte earlier makes every
later event unchained) still counts as a commit of its run (:attr:`Checked.stray`;
the events carry the run id); it never loosens anything. The next writer
chains onto the last obeyed event, so one refused line does not poison the
events written after it.

Rejected: chaining the events into the next checkpoint's signed statement
instead (no signature per event). The events matter exactly when the newest
checkpoints are gone (a rollback) or about to be moved (a branch), so no later
statement is there to vouch for them. A seal costs ~0.16 ms and its check
~0.15 ms (P-256, measured on a 2-core VM), made only for these events (a few
per checkpoint), never per step. What
stays out of reach: an attacker who truncates the journal's tail (the chain
cannot tell the end of a run from a cut) or holds the signing key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from recovery.integrity.keys.signing import Signer, TrustStore

STEERING = frozenset({"start", "warm_start", "resume", "checkpoint", "retired", "abandoned"})
"""Events whose content a resume acts on."""
PREV = "prev"
AUTH = "auth"
UNCHAINED = (
    "not chained to the signed event before it (an event was removed, altered or reordered, "
    "or this one was copied from another journal)"
)
DOMAIN = b"recovery journal event v1\n"
"""Prefixed to what is signed, so an event's signature is never a valid signature of
anything else this key signs (statements are signed over DSSE's own encoding)."""


def steers(record: dict[str, Any]) -> bool:
    """Whether a resume acts on ``record`` (so it must be sealed). Any record a writer did
    not write may hold anything under ``event`` (a list is not hashable)."""
    event = record.get("event")
    return isinstance(event, str) and event in STEERING


def _canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def link(record: dict[str, Any]) -> str:
    """The chain link of a sealed record: the next sealed record's ``prev``."""
    return hashlib.sha256(_canonical(record)).hexdigest()


def seal(record: dict[str, Any], prev: str, signer: Signer) -> dict[str, Any]:
    """``record`` chained after the sealed event whose link is ``prev``, and signed."""
    body = {k: v for k, v in record.items() if k not in (PREV, AUTH)}
    body[PREV] = prev
    sig = signer.sign_bytes(DOMAIN + _canonical(body))
    return {**body, AUTH: {"key": signer.key_id, "sig": base64.b64encode(sig).decode()}}


@dataclass(frozen=True)
class Refused:
    """A steering event that is not obeyed, and why."""

    line: int
    event: str
    why: str

    def describe(self) -> str:
        return f"line {self.line} ({self.event!r}): {self.why}"


@dataclass(frozen=True)
class Checked:
    """What :func:`check` made of a journal."""

    obeyed: list[dict[str, Any]]
    """Every record but the refused steering events, in file order."""
    tip: str
    """The link of the last obeyed steering event (``""``: none): where the next one chains."""
    refused: list[Refused]
    stray: list[dict[str, Any]]
    """Refused events whose signature verifies but which are out of the chain: not obeyed,
    but a caller may count what only makes it *more* cautious (a commit the run recorded:
    breaking the chain must not hide a rollback)."""


def _why_not(record: dict[str, Any], tip: str, trust: TrustStore) -> str | None:
    auth = record.get(AUTH)
    if auth is None:
        return "unsigned (forged, or written before journal events were signed)"
    try:
        kid, sig = str(auth["key"]), base64.b64decode(auth["sig"], validate=True)
        body = {k: v for k, v in record.items() if k != AUTH}
    except (KeyError, TypeError, ValueError, binascii.Error):
        return "its seal is malformed"
    if trust.get(kid) is None:
        return f"signed by key {kid[:16]}…, which is not trusted"
    if not trust.verifies(kid, DOMAIN + _canonical(body), sig):
        return "its signature does not verify (the event was altered)"
    if record.get(PREV) != tip:
        return UNCHAINED
    return None


def check(numbered: Iterable[tuple[int, dict[str, Any]]], trust: TrustStore) -> Checked:
    """Walk ``(line, record)`` pairs in file order; obey a steering event only when sealed
    by a key in ``trust`` and chained to the last one obeyed."""
    obeyed: list[dict[str, Any]] = []
    refused: list[Refused] = []
    stray: list[dict[str, Any]] = []
    tip = ""
    for line, record in numbered:
        if steers(record):
            why = _why_not(record, tip, trust)
            if why is not None:
                refused.append(Refused(line, str(record.get("event")), why))
                if why == UNCHAINED:
                    stray.append(record)
                continue
            tip = link(record)
        obeyed.append(record)
    return Checked(obeyed, tip, refused, stray)
