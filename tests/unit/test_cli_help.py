"""Every subcommand's ``--help``: a summary, examples, its exit codes; every argument has help."""

from __future__ import annotations

import argparse

import pytest

from recovery import cli
from recovery.cli import helptext
from recovery.exitcodes import EXIT_CODES


def subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


FULL = subparsers(cli.build_parser())


def test_the_table_lists_every_subcommand_with_the_summary_its_module_registers():
    assert list(FULL.choices) == list(helptext.COMMANDS)
    registered = {a.dest: a.help for a in FULL._choices_actions}
    assert registered == {name: c.summary for name, c in helptext.COMMANDS.items()}


@pytest.mark.parametrize("name", list(helptext.COMMANDS))
def test_each_help_shows_examples_and_the_exit_codes_with_their_meanings(name):
    text = FULL.choices[name].format_help()
    examples = text.split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert examples and all(line.strip().startswith("recovery ") for line in examples)
    assert any(f"recovery {name}" in line for line in examples)
    codes = text.split("exit codes:\n", 1)[1].splitlines()
    numbers = [int(line.split()[0]) for line in codes]
    assert {0, 2} <= set(numbers) and numbers == sorted(set(numbers))
    meanings = {0: "success", 2: "bad command line (argparse's usage message)"}
    meanings |= {code: what for _, code, what in EXIT_CODES}
    for line, number in zip(codes, numbers, strict=True):
        assert line.split(None, 1)[1] == meanings[number]


@pytest.mark.parametrize("name", list(helptext.COMMANDS))
def test_every_argument_has_help_text(name):
    lacking = [
        a.option_strings[0] if a.option_strings else a.dest
        for a in FULL.choices[name]._actions
        if not (a.help or "").strip()
    ]
    assert lacking == [], f"recovery {name}: arguments without help: {lacking}"


def test_the_top_level_help_lists_every_code_and_every_subcommand_without_importing_them():
    lazy = cli.build_parser([])
    text = lazy.format_help()
    assert all(name in text for name in helptext.COMMANDS)
    assert all(f"{code:>3}  {what}" in text for _, code, what in EXIT_CODES)
    assert all(not p._actions[1:-1] for p in subparsers(lazy).choices.values())  # -h, --json


def test_an_unknown_code_in_the_table_is_refused():
    with pytest.raises(KeyError, match="exit code 99"):
        helptext.meaning(99)
