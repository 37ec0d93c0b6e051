"""``+resume=`` values that name no checkpoint: each says what it is and what to pass instead."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from recipes.data import DataConfig, generate
from recovery import cli
from recovery.cli.codes import exit_code
from recovery.errors import CheckpointNotFoundError, ConfigError, ManifestError
from recovery.format.layout import METRICS_FILE, SIGNATURE_FILE, step_dir_name
from recovery.integrity.keys.trust import KEY_ENV
from recovery.run.restoring import choose
from tests import launcher
from tests.conftest import commit_state, tiny_state

REPO = Path(__file__).resolve().parents[2]
DATA = {"num_users": 200, "num_items": 100, "num_interactions": 2000, "shards": 2}
"""A tiny interaction log (as in tests/integration/conftest.py's SMALL)."""


@pytest.fixture
def run_dir(tmp_path, signer):
    """A run directory with checkpoints at steps 2 and 4 and a journal."""
    run = tmp_path / "ck" / "r"
    for step in (2, 4):
        commit_state(run, tiny_state(), step, signer)
    (run / METRICS_FILE).write_text('{"event": "start"}\n')
    return run


@pytest.mark.parametrize(
    ("word", "hint"),
    [
        ("lastest", "did you mean latest?"),
        ("Latest", "did you mean latest?"),
        ("bset", "did you mean best?"),
        ("step-00000010", "did you mean +resume=10?"),
        ("yesterday", ""),
    ],
)
def test_a_bare_word_that_is_not_latest_a_step_or_a_path_is_a_config_error(
    tmp_path, monkeypatch, word, hint
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        choose.parse_spec(word)
    msg = str(err.value)
    assert msg.startswith(f"resume: {word!r} is neither latest, a step number nor an existing path")
    assert "\n" not in msg and str(tmp_path) in msg and "+resume=latest" in msg
    assert (hint in msg) if hint else "did you mean" not in msg
    assert exit_code(err.value) == 12


def test_a_bare_word_naming_something_that_exists_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lastest").mkdir()
    assert choose.parse_spec("lastest") == Path("lastest")
    assert choose.parse_spec("latest") == "latest" and choose.parse_spec("12") == 12


def test_a_missing_path_is_still_checkpoint_not_found(tmp_path, trust):
    missing = tmp_path / "nowhere" / step_dir_name(3)
    assert choose.parse_spec(str(missing)) == missing
    with pytest.raises(CheckpointNotFoundError, match="no such checkpoint directory") as err:
        choose.select(tmp_path, str(missing), trust)
    assert exit_code(err.value) == 3


def test_a_run_directory_says_so_and_names_latest_and_steps(run_dir, trust):
    with pytest.raises(CheckpointNotFoundError) as err:
        choose.select(run_dir, str(run_dir), trust)
    msg = str(err.value)
    assert msg.startswith(f"{run_dir}: is a run directory")
    assert "step-* checkpoint directories" in msg and METRICS_FILE in msg
    assert "+resume=latest" in msg and "+resume=<step>" in msg
    assert str(run_dir / step_dir_name(4)) in msg and "[2, 4]" in msg
    assert "never committed" not in msg and "\n" not in msg
    assert exit_code(err.value) == 3


def test_a_run_directory_with_only_a_journal_is_a_run_directory_too(tmp_path, trust):
    run = tmp_path / "r"
    run.mkdir()
    (run / METRICS_FILE).write_text("")
    with pytest.raises(CheckpointNotFoundError, match="is a run directory .*no committed"):
        choose.select(run, str(run), trust)


def test_a_regular_file_says_a_checkpoint_is_a_directory(run_dir, trust):
    target = run_dir / METRICS_FILE
    with pytest.raises(CheckpointNotFoundError) as err:
        choose.select(run_dir, str(target), trust)
    msg = str(err.value)
    assert msg.startswith(f"{target}: is a file, not a checkpoint; a checkpoint is a directory")
    assert exit_code(err.value) == 3
    # a file inside a checkpoint: the message names the directory to pass instead
    inner = run_dir / step_dir_name(4) / "state.json"
    with pytest.raises(CheckpointNotFoundError, match=f"pass {run_dir / step_dir_name(4)}"):
        choose.select(run_dir, str(inner), trust)


def test_a_step_directory_without_its_signature_is_still_uncommitted(run_dir, trust):
    (run_dir / step_dir_name(4) / SIGNATURE_FILE).unlink()
    with pytest.raises(ManifestError, match="never committed") as err:
        choose.select(run_dir, 4, trust)
    assert exit_code(err.value) == 4


def test_verify_of_a_run_directory_is_one_line_with_code_3(run_dir, signer, capsys):
    assert cli.main(["verify", str(run_dir), "--trusted", str(signer.path.parent)]) == 3
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "is a run directory" in err


@pytest.mark.integration
def test_train_py_with_a_typo_of_latest_prints_one_line_and_exits_12(tmp_path, signer):
    data = tmp_path / "data"
    generate(DataConfig(root=str(data), **DATA))  # ready, so the run logs nothing before
    done = launcher.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            f"checkpoint.root={tmp_path / 'ck'}",
            f"recipe.data.root={data}",
            *(f"recipe.data.{k}={v}" for k, v in DATA.items()),
            "recipe.batch_size=64",
            "train.steps=4",
            "run.name=r",
            "+resume=lastest",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, KEY_ENV: str(signer.path), "PYTHONPATH": str(REPO)},
    )
    output = done.stdout + done.stderr
    assert done.returncode == 12, output
    assert output.count("\n") == 1 and "Traceback" not in output, output
    assert output.startswith("error: resume: 'lastest' is neither latest") and (
        "did you mean latest?" in output
    )


def test_a_bad_spec_is_named_by_the_key_it_came_from():
    with pytest.raises(ConfigError, match=r"^export\.source: 'lastest'.*did you mean latest\?"):
        choose.parse_spec("lastest", "export.source")
    with pytest.raises(ConfigError, match=r"export\.source=latest"):
        choose.parse_spec("lastest", "export.source")
