"""Every fenced code block of README.md and docs/ is run or checked, and the site is built.

The convention (docs/dev/docs.md): a ``python`` block is run, in a temporary directory,
by the project's Python, unless its fence carries ``title="fragment: <reason>"``; a
shell block (``sh``, ``console``) is checked command by command against what it names
(the real ``recovery`` parser, ``train.py``'s own preflight, the Makefile's targets,
the package's extras, an installed program); any other info string is output or a
format, never run. ``mkdocs build --strict`` runs in ``make test`` (its ``lint``), not
here: the suite stays fast.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
from markdown.extensions.toc import slugify

from recovery import cli
from recovery.errors import RecoveryError
from tests import launcher, system

TOP = Path(__file__).resolve().parents[2]
PAGES = [TOP / "README.md", *sorted((TOP / "docs").rglob("*.md"))]
SHELLS = {"sh", "console"}
NOT_COMMANDS = {"", "json", "text", "markdown", "yaml"}  # output, file trees, formats
FRAGMENT = re.compile(r'title="fragment: \S[^"]*"')


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    info: str
    code: str

    def __str__(self) -> str:
        return f"{self.path.relative_to(TOP)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file (CommonMark fences: a closing fence is the
    opening one's character, at least as long, with no info string)."""
    found, lines, i = [], path.read_text().splitlines(), 0
    while i < len(lines):
        opening = re.match(r"^(`{3,}|~{3,})(.*)$", lines[i])
        if not opening:
            i += 1
            continue
        fence, info = opening.group(1), opening.group(2).strip()
        end = i + 1
        while end < len(lines) and not re.fullmatch(
            re.escape(fence[0]) + f"{{{len(fence)},}}\\s*", lines[end]
        ):
            end += 1
        lang = info.split(" ", 1)[0]
        found.append(Block(path, i + 1, lang, info, "\n".join(lines[i + 1 : end]) + "\n"))
        i = end + 1
    return found


ALL = [b for p in PAGES for b in blocks(p)]
PYTHON = [b for b in ALL if b.lang == "python"]
RUN = [b for b in PYTHON if not FRAGMENT.search(b.info)]


def test_every_block_is_run_checked_or_output():
    assert len(ALL) > 30 and RUN, "the docs' blocks were not found"
    for block in ALL:
        known = block.lang in SHELLS | NOT_COMMANDS | {"python"}
        assert known, f"{block}: ```{block.info}: run it (python), check it (sh) or mark it"
        if block.lang == "python" and "title=" in block.info:
            assert FRAGMENT.search(block.info), f'{block}: a title must be "fragment: <reason>"'


def test_the_python_blocks_run(tmp_path):
    """Each runnable block in a process and directory of its own (its own dev key), forked
    by the tests' preloaded launcher, twice: the second run of a requeue-safe loop resumes
    and has nothing left to do."""
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "PYTHONPATH": str(TOP)}
    env.pop("RECOVERY_SIGNING_KEY", None)
    for n, block in enumerate(RUN):
        where = tmp_path / f"block-{n}"
        where.mkdir()
        script = where / "block.py"
        script.write_text(block.code)
        for attempt in (1, 2):
            done = launcher.run(
                [sys.executable, str(script)], cwd=where, env=env, profile="core",
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert done.returncode == 0, f"{block} (run {attempt}):\n{done.stderr[-3000:]}"


def commands(block: Block) -> list[tuple[int, list[str]]]:
    """(line, argv) of each command of a shell block; a pipeline is several commands."""
    found = []
    for offset, line in enumerate(block.code.splitlines(), start=1):
        if block.lang == "console":
            if not line.startswith("$ "):
                continue  # output
            line = line[2:]
        words = shlex.split(line, comments=True)
        argv: list[str] = []
        for word in [*words, "|"]:
            if word != "|":
                argv.append(word)
            elif argv:
                found.append((block.line + offset, argv))
                argv = []
    return found


SHELL_COMMANDS = [
    (f"{b.path.relative_to(TOP)}:{line}", argv)
    for b in ALL
    if b.lang in SHELLS
    for line, argv in commands(b)
]
MAKE_TARGETS = set(re.findall(r"^([\w-]+):", (TOP / "Makefile").read_text(), flags=re.M))
EXTRAS = set(
    tomllib.loads((TOP / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)
PROGRAMS = {
    "dvc",
    "tensorboard",
    "model_signing",
    "echo",
    "git",
    "openssl",
    "sha256sum",
    "pytest",
    "sbatch",  # SLURM: installed by make test for the tests of examples/slurm
    "source",  # the shell's: `source .venv/bin/activate`, the venv make creates
}
NEEDED = {"sbatch": system.SLURM}
"""Programs from system packages: where absent, their commands' checks skip (tests.system)."""


def check_train_py(where: str, argv: list[str]) -> None:
    from recovery.cli.overrides import preflight

    try:
        preflight("train.py", argv, TOP / "conf")
    except RecoveryError as err:  # a ConfigError (exit 12) or a StorageError
        raise AssertionError(f"{where}: train.py {shlex.join(argv)}: {err}") from None


def check_recovery(where: str, argv: list[str]) -> None:
    try:
        cli.build_parser().parse_args(argv)
    except SystemExit as stop:  # argparse's refusal (2), or --help/--version (0)
        assert stop.code == 0, f"{where}: recovery {shlex.join(argv)} does not parse"


def check_python(where: str, argv: list[str]) -> None:
    if argv[1] == "train.py":
        check_train_py(where, argv[2:])
    elif argv[1] == "-m":
        module = TOP / (argv[2].replace(".", "/") + ".py")
        assert module.is_file(), f"{where}: no module {argv[2]}"
    elif argv[1] == "-c":
        compile(argv[2], where, "exec")
    else:
        script = argv[1]
        assert (TOP / script).is_file() or script.startswith("my_"), f"{where}: no {script}"


def check_pip(where: str, argv: list[str]) -> None:
    assert argv[1] == "install", where
    for spec in argv[2:]:
        if spec == "-e":
            continue
        extras = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", spec)
        if extras:
            unknown = set(filter(None, (extras.group(1) or "").split(","))) - EXTRAS
            assert not unknown, f"{where}: no extra {unknown} in pyproject.toml"
        else:
            assert re.fullmatch(r"torch==[\d.]+", spec), f"{where}: install {spec}?"


@pytest.mark.parametrize(("where", "argv"), SHELL_COMMANDS, ids=[w for w, _ in SHELL_COMMANDS])
def test_the_shell_commands_exist_as_written(where, argv):
    while re.fullmatch(r"[A-Z_]+=\S*", argv[0]):  # a variable set for the command
        argv = argv[1:]
    program = argv[0]
    if program == "recovery":
        check_recovery(where, argv[1:])
    elif program in ("python", "python3"):
        check_python(where, argv)
    elif program == "torchrun":
        script = argv.index("train.py")
        check_train_py(where, argv[script + 1 :])
    elif program == "make":
        assert set(argv[1:]) <= MAKE_TARGETS, f"{where}: no Makefile target {argv[1:]}"
    elif program == "pip":
        check_pip(where, argv)
    else:
        assert program in PROGRAMS, f"{where}: {program}: add it to the known programs"
        if program in NEEDED:
            system.require(NEEDED[program], to_run=False)  # only looked up, never run
        path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        builtin = program in ("echo", "source")
        if program == "source":
            assert argv[1:] == [".venv/bin/activate"], f"{where}: source what? {argv}"
        assert builtin or shutil.which(program, path=path), f"{where}: {program} not installed"


def test_make_test_builds_the_site_strictly_and_make_docs_serves_it():
    makefile = (TOP / "Makefile").read_text()
    recipes = dict(re.findall(r"^([\w-]+):[^\n]*\n((?:\t[^\n]*\n)*)", makefile, flags=re.M))
    assert "mkdocs build --strict" in recipes["lint"] and "--site-dir site" in recipes["lint"]
    assert "$(MAKE) --no-print-directory lint" in recipes["test"]
    assert "mkdocs serve" in recipes["docs"]
    assert "/site/" in (TOP / ".gitignore").read_text().splitlines()
    config = (TOP / "mkdocs.yml").read_text()
    assert "strict: true" in config and "font: false" in config


def test_the_api_page_documents_every_public_name():
    import recovery

    api = (TOP / "docs" / "api.md").read_text()
    for name in recovery.__all__:
        assert f"::: recovery.{name}\n" in api, name


def test_the_readmes_links_reach_files_and_headings():
    """The README is not part of the site, so mkdocs does not check its links: here."""
    readme = (TOP / "README.md").read_text()
    for target in re.findall(r"\]\(([^)\s]+)\)", readme):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        file = TOP / path if path else TOP / "README.md"
        assert file.is_file(), f"README.md links to {path}, which does not exist"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", file.read_text(), flags=re.M)
            assert anchor in {slugify(h, "-") for h in headings}, f"README.md: {target}"
