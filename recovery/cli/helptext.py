"""What each subcommand's ``--help`` shows besides its arguments: examples and exit codes.

One table for every subcommand (:data:`COMMANDS`), so the top-level ``recovery --help``
can list the subcommands without importing them (:mod:`recovery.cli.main` imports a
command's module only when that command runs) and each subparser gets the same epilog:
its examples, then the exit codes it can end with, numbers and meanings taken from
:data:`recovery.exitcodes.EXIT_CODES` (plus 0 and argparse's 2).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from recovery.exitcodes import EXIT_CODES

OK, USAGE = 0, 2
"""Success; a bad command line (argparse's own refusals)."""

VERIFYING = (3, 4, 5, 6, 7, 8, 9, 27, 16, 17, 15, 29, 10, 18)
"""What reading one artifact can end with: not found, then each verification failure."""


@dataclass(frozen=True)
class Command:
    """One subcommand's line in ``recovery --help``, its examples, its exit codes."""

    module: str
    """The :mod:`recovery.cli` module whose ``register`` adds it."""
    summary: str
    examples: tuple[str, ...]
    codes: tuple[int, ...]


COMMANDS: dict[str, Command] = {
    "ls": Command(
        "listing",
        "table of a run's checkpoints, each verified, with signer",
        (
            "recovery ls checkpoints/default",
            "recovery ls checkpoints/default/step-00000010    # that one checkpoint's row",
            "recovery ls checkpoints/default --json | jq '.checkpoints[].status'",
        ),
        (OK, USAGE, *VERIFYING, 12),
    ),
    "verify": Command(
        "reading",
        "signature, trust, every file's hash, purpose contract",
        (
            "recovery verify checkpoints/default/step-00000010",
            "recovery verify artifacts/default --trusted keys/release.pub --json",
        ),
        (OK, USAGE, *VERIFYING, 12),
    ),
    "inspect": Command(
        "reading",
        "step, purpose, signer, components, digests, provenance",
        (
            "recovery inspect checkpoints/default/step-00000010",
            "recovery inspect artifacts/default --json | jq .parameters_sha256",
        ),
        (OK, USAGE, *VERIFYING, 12),
    ),
    "audit": Command(
        "reading",
        "verify and walk the lineage back to the run's start",
        (
            "recovery audit artifacts/default",
            "recovery audit artifacts/default --format dot | dot -Tsvg > lineage.svg",
        ),
        (OK, USAGE, *VERIFYING, 24, 12, 1),
    ),
    "report": Command(
        "reporting",
        "one HTML file: loss with resumes, checkpoint timeline, lineage, cost",
        (
            "recovery report checkpoints/default",
            "recovery report checkpoints/default --out run.html --mtbf 24h",
        ),
        (OK, USAGE, *VERIFYING, 12, 28),
    ),
    "drill": Command(
        "drill",
        "kill-and-resume drill of train.py, or of any command (-- CMD ... {run_dir} ...), "
        "or --preflight PATH",
        (
            "recovery drill",
            "recovery drill --kills 4 --seed 0 checkpoint.async=true",
            "recovery drill --kills 4 -- python my_train.py --run-dir {run_dir}",
            "recovery drill --preflight checkpoints/default/step-00000010",
        ),
        (OK, USAGE, 23, 12, *VERIFYING),
    ),
    "predict": Command(
        "serve",
        "serve JSON lines of raw inputs with an inference artifact",
        (
            "recovery predict artifacts/default --input inputs.jsonl",
            "recovery predict artifacts/default < inputs.jsonl > predictions.jsonl",
        ),
        (OK, USAGE, *VERIFYING, 12, 1),
    ),
    "export": Command(
        "serve",
        "export a continuation checkpoint as a signed inference artifact",
        (
            "recovery export                        # the project's export.* config",
            "recovery export run.name=demo export.dtype=bfloat16 --json",
        ),
        (OK, USAGE, *VERIFYING, 22, 11, 12, 20, 28),
    ),
    "import": Command(
        "importing",
        "a torch.save file, Lightning .ckpt, safetensors file or HF directory -> "
        "a signed warm-start artifact",
        (
            "recovery import model.safetensors --out imported/base",
            "recovery import hf/gpt2 --out imported/gpt2 --json",
        ),
        (OK, USAGE, 3, 5, 27, 10, 12, 20, 28),
    ),
    "plan": Command(
        "plan",
        "checkpoint interval arithmetic: cost vs expected loss",
        (
            "recovery plan --cost 60s --mtbf 24h",
            "recovery plan --cost 60s --mtbf 24h --intervals 5m,1h,4h --async --json",
        ),
        (OK, USAGE, 12),
    ),
    "sync": Command(
        "sync",
        "register (and push) every checkpoint DVC has not got yet",
        (
            "recovery sync checkpoints/default",
            "recovery sync checkpoints/default --push --remote storage",
        ),
        (OK, USAGE, 3, 21, 12),
    ),
    "keygen": Command(
        "keys",
        "create an ECDSA P-256 signing key pair",
        ("recovery keygen --out keys/release", "recovery keygen --out keys/release --force"),
        (OK, USAGE, 20, 12),
    ),
}
"""Every subcommand, in the order ``recovery --help`` lists them."""


def meaning(code: int) -> str:
    """What exit ``code`` means (README's table, :mod:`recovery.exitcodes`)."""
    if code == OK:
        return "success"
    if code == USAGE:
        return "bad command line (argparse's usage message)"
    for _, number, what in EXIT_CODES:
        if number == code:
            return what
    raise KeyError(f"exit code {code} is not in recovery.exitcodes.EXIT_CODES")


def epilog(name: str) -> str:
    """``name``'s examples and exit codes, as its ``--help`` prints them."""
    command = COMMANDS[name]
    lines = ["examples:", *(f"  {e}" for e in command.examples), "", "exit codes:"]
    lines += [f"  {code:>3}  {meaning(code)}" for code in sorted(set(command.codes))]
    return "\n".join(lines)


def all_codes() -> str:
    """Every exit code, for the epilog of ``recovery --help``."""
    rows = sorted([(OK, meaning(OK)), (USAGE, meaning(USAGE))] + [(c, w) for _, c, w in EXIT_CODES])
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {what}" for code, what in rows)


def apply(sub: argparse._SubParsersAction[Any]) -> None:
    """Give every registered subparser its epilog, kept as written (examples are lines)."""
    for name, parser in sub.choices.items():
        parser.epilog = epilog(name)
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
