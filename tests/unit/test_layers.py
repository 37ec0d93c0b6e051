"""The package's shape: a light core, the import contract, what an install contains."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from recovery.format.layout import step_dir_name
from tests.conftest import commit_state, tiny_state

REPO = Path(__file__).resolve().parents[2]
EXTRAS = ("dvc", "hydra", "omegaconf", "matplotlib", "sklearn", "mlflow", "tensorboard")
# Run in a fresh interpreter: every extra unimportable, as in a core-only install
# (a None entry in sys.modules is what `import` and importlib.util.find_spec both honour).
BLOCK = f"""
import sys
sys.modules.update(dict.fromkeys({EXTRAS!r}))
"""


def python(code: str, *, cwd: Path = REPO, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        # this checkout's package, whichever one the environment has installed
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def test_import_recovery_pulls_in_no_extra():
    out = python(
        "import sys, recovery, recovery.cli\n"
        f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({EXTRAS!r} + ('recipes',))))"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_reading_commands_work_without_any_extra(tmp_path, signer):
    run_dir = tmp_path / "run"
    commit_state(run_dir, tiny_state(), 3, signer)
    path = run_dir / step_dir_name(3)
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    (trusted / "k.pub").write_bytes(signer.public_pem)
    commands = [
        [*argv, "--trusted", str(trusted)]
        for argv in (["verify", str(path)], ["inspect", str(path)], ["audit", str(path)])
    ] + [["ls", str(run_dir), "--trusted", str(trusted)]]
    out = python(  # one interpreter for all four: each start imports torch
        BLOCK
        + "from recovery import cli\n"
        + f"codes = [cli.main(argv) for argv in {commands!r}]\n"
        + "print(codes)\nsys.exit(any(codes))",
        cwd=tmp_path,
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("[0, 0, 0, 0]"), (
        out.stdout,
        out.stderr,
    )


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["sync", "run"], ".[dvc]"),
        (["export"], ".[hydra]"),
        (["drill"], ".[hydra]"),
    ],
)
def test_a_command_that_needs_an_extra_names_it(tmp_path, argv, extra):
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("")  # a DVC repository, for sync
    (tmp_path / "run").mkdir()
    out = python(BLOCK + f"from recovery import cli\nsys.exit(cli.main({argv!r}))", cwd=tmp_path)
    assert out.returncode == 12, out.stderr
    assert extra in out.stderr and "Traceback" not in out.stderr


def test_the_import_contract_refuses_an_upward_import(tmp_path):
    for name in ("recovery", "recipes"):
        shutil.copytree(REPO / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    lint = [str(Path(sys.executable).parent / "lint-imports")]
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    kept = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert kept.returncode == 0, kept.stdout
    codec = tmp_path / "recovery" / "format" / "codec.py"
    codec.write_text(codec.read_text() + "\nfrom recovery.run import checkpointer  # noqa\n")
    broken = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, env=env)
    assert broken.returncode != 0
    assert "BROKEN" in broken.stdout
    assert "recovery.format.codec -> recovery.run.checkpointer" in broken.stdout


def test_the_wheel_holds_the_library_and_not_the_recipes(tmp_path):
    src = tmp_path / "src"  # a copy: an in-tree build would leave build/ in the checkout
    for name in ("recovery", "recipes", "tests"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src)
    built = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"),
            *("-w", str(tmp_path), str(src)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("recovery-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert "recipes" not in tops and "tests" not in tops
    assert "recovery/cli/main.py" in names and "recovery/run/checkpointer.py" in names
    metadata = next(n for n in names if n.endswith("METADATA"))
    requires = [
        line.split(":", 1)[1].strip()
        for line in zipfile.ZipFile(wheel).read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    core = [r for r in requires if "extra ==" not in r]
    assert not any(r.lower().startswith(("dvc", "hydra", "matplotlib", "scikit")) for r in core)
    assert any(r.startswith("dvc") and 'extra == "dvc"' in r for r in requires)


def test_the_linter_sees_every_module():
    # ruff skips folders named like build outputs (dist/, build/) by default: a layer so
    # named would never be linted, and no run would say so
    ruff = Path(sys.executable).parent / "ruff"
    shown = subprocess.run(
        [str(ruff), "check", "--no-cache", "--show-files", "recovery", "recipes"],
        cwd=REPO,
        capture_output=True,
        text=True,
    ).stdout
    linted = {Path(line.strip()).resolve() for line in shown.splitlines() if line.strip()}
    modules = {p.resolve() for d in ("recovery", "recipes") for p in (REPO / d).rglob("*.py")}
    assert modules - linted == set()


def test_the_run_layer_is_composed_of_parts_in_folders_a_newcomer_can_read():
    """Issue 40's shape, held: recovery/run/ keeps at most 10 modules at its top and at
    least 4 sub-packages of at most 12 modules each; no class of the library has more than
    2 classes of ours above it (errors aside), and the Checkpointer none."""
    import importlib
    import inspect
    import pkgutil

    import recovery
    from recovery.run.checkpointer import Checkpointer

    run = REPO / "recovery" / "run"
    assert len(list(run.glob("*.py"))) <= 10
    packages = [d for d in run.iterdir() if (d / "__init__.py").is_file()]
    assert len(packages) >= 4
    assert all(len(list(d.glob("*.py"))) <= 12 for d in packages), packages
    towers = []
    for info in pkgutil.walk_packages(recovery.__path__, "recovery."):
        module = importlib.import_module(info.name)
        for cls in vars(module).values():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            ours = [b for b in cls.__mro__[1:] if b.__module__.startswith("recovery.")]
            if len(ours) > 2 and not issubclass(cls, BaseException):
                towers.append((cls.__qualname__, [b.__name__ for b in ours]))
    assert towers == []
    assert Checkpointer.__bases__ == (object,)
