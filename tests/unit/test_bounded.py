"""Bounded parsing: no input nests or grows past a limit into a crash."""

import hashlib
import os

import pytest

from recovery import cli
from recovery.format import bounded
from recovery.format.layout import SIGNATURE_FILE, STATE_FILE, step_dir_name
from recovery.run.restoring import choose
from tests.conftest import commit_state, resign, tiny_state, train_steps

DEEP = b"[" * 200_000 + b"]" * 200_000


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("[" * bounded.MAX_DEPTH + "]" * bounded.MAX_DEPTH, True),
        ("[" * (bounded.MAX_DEPTH + 1) + "]" * (bounded.MAX_DEPTH + 1), False),
        ('{"a": ' * 150 + "1" + "}" * 150, False),
        (DEEP.decode(), False),
        ('{"a": [1, {"b": 2}]}', True),
        ("{not json", False),
    ],
)
def test_json_depth_is_bounded(text, ok):
    if ok:
        bounded.json_loads(text)
    else:
        with pytest.raises(ValueError):
            bounded.json_loads(text)


def test_yaml_and_size_are_bounded():
    with pytest.raises(ValueError, match="levels deep"):
        bounded.yaml_load("[" * 5000 + "]" * 5000)
    with pytest.raises(ValueError, match="not YAML"):
        bounded.yaml_load("a: [")
    with pytest.raises(ValueError, match="more than the 10 accepted"):
        bounded.json_loads(b"[1, 2, 3, 4, 5]", limit=10)


def _deep_state(path, signer):
    """Replace ``state.json`` by 200k nested lists, re-signed: verified bytes that do not decode."""
    os.chmod(path / STATE_FILE, 0o644)
    (path / STATE_FILE).write_bytes(DEEP)

    def edit(st):
        for res in st["predicate"]["resources"]:
            if res["name"] == STATE_FILE:
                res["digest"] = hashlib.sha256(DEEP).hexdigest()
        st["predicate"]["recovery"]["sizes"][STATE_FILE] = len(DEEP)

    resign(path, signer, edit)


def _deep_sig(path):
    os.chmod(path / SIGNATURE_FILE, 0o644)
    (path / SIGNATURE_FILE).write_bytes(DEEP)


def _trusted(signer, tmp_path):
    d = tmp_path / "trusted"
    d.mkdir(exist_ok=True)
    (d / "k.pub").write_bytes(signer.public_pem)
    return ["--trusted", str(d)]


@pytest.mark.parametrize(("damage", "code"), [("sig", 16), ("state", 10)])
def test_verify_and_audit_refuse_deep_nesting_with_their_code(
    checkpoint, signer, tmp_path, capsys, damage, code
):
    path, _ = checkpoint
    _deep_sig(path) if damage == "sig" else _deep_state(path, signer)
    for command in ("verify", "audit", "inspect"):
        assert cli.main([command, str(path), *_trusted(signer, tmp_path)]) == code, command
        err = capsys.readouterr().err
        assert "Traceback" not in err and str(path) in err


def test_resume_latest_falls_back_past_deep_nesting(tmp_path, signer, trust, caplog):
    run_dir = tmp_path / "run"
    state = tiny_state()
    for step in (3, 4, 5):
        train_steps(state, 1)
        commit_state(run_dir, state, step, signer)
    _deep_state(run_dir / step_dir_name(5), signer)
    _deep_sig(run_dir / step_dir_name(4))
    loaded = choose.select(run_dir, "latest", trust)
    assert loaded is not None and loaded.decoded.step == 3
    assert [p.name for p, _ in loaded.skipped] == [step_dir_name(5), step_dir_name(4)]
    assert "RESUME FALLBACK" in caplog.text


@pytest.mark.parametrize(("depth", "refused"), [(1, False), (100, False), (101, True)])
def test_json_at_the_depth_limit_whatever_its_length_the_short_cut_included(depth, refused):
    """A text of at most 2 x MAX_DEPTH characters skips the walk: it cannot nest past the
    limit. The shortest text nested one level too deep is just past that length."""
    from recovery.format import bounded

    text = "[" * depth + "]" * depth
    assert (len(text) > 2 * bounded.MAX_DEPTH) == refused
    if refused:
        with pytest.raises(ValueError, match="nested more than 100 levels deep"):
            bounded.json_loads(text)
    else:
        assert bounded.json_loads(text) is not None
