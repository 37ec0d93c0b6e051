"""``recovery predict --input``: every bad line is refused before the model runs, by number.

The artifact is a real one (the embedding recipe's serving program on a tiny
catalogue, exported from a committed checkpoint); the CLI runs as the console
script, in a working directory whose default trust store is empty.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from recipes.data import DataConfig, load
from recipes.embedding import DotProduct
from recipes.export import spec_for
from recovery.errors import FormatError
from recovery.format.layout import step_dir_name
from recovery.run.restoring import choose
from recovery.tools import export
from tests import launcher
from tests.conftest import commit_state, tiny_state

RECOVERY = str(Path(sys.executable).parent / "recovery")
INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, signer, trust):
    """(artifact dir, a known user id, a known item id, trust flags)."""
    root = tmp_path_factory.mktemp("predict")
    cfg = DataConfig(root=str(root / "d"), num_users=30, num_items=20, num_interactions=400)
    cfg.shards = 1
    data = load(cfg)
    torch.manual_seed(0)
    spec = spec_for({"model": DotProduct(30, 20, 4, 0.0).state_dict()}, data, torch.float32)
    commit_state(root / "run", tiny_state(), 1, signer)
    source = choose.load(root / "run" / step_dir_name(1), trust)
    out = root / "artifact"
    export.write_artifact(out, source, spec, dtype="float32", signer=signer)
    flags = ["--trusted", str(signer.path.parent)]
    return out, int(data.user_ids[0]), int(data.item_ids[0]), flags


def predict(artifact, tmp_path, text: str | None, *, name: str = "in.jsonl"):
    """Run ``recovery predict`` on ``text`` written to ``name`` (absent when ``text`` is None)."""
    path, _, _, flags = artifact
    if text is not None:
        (tmp_path / name).write_text(text)
    return launcher.run(
        [RECOVERY, "predict", str(path), "--input", name, *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_good_lines_are_served_one_output_each_and_unknown_ids_answered(artifact, tmp_path):
    _, user, item, _ = artifact
    lines = [
        json.dumps({"user_id": user, "item_id": item}),
        "",
        json.dumps({"user_id": INT64_MAX, "item_id": item}),  # in range, not catalogued
    ]
    done = predict(artifact, tmp_path, "\n".join(lines) + "\n")
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["user_id"], r["known"]) for r in out] == [(user, True), (INT64_MAX, False)]
    assert isinstance(out[0]["score"], float) and out[1]["score"] is None


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        # the silent cast this guards against: 2144173.5 was answered as 2144173
        (
            '{"user_id": USER.5, "item_id": ITEM}',
            "field 'user_id': expected an integer (int64), found USER.5 (a float)",
        ),
        ('{"user_id": USER, "item_id": true}', "item_id': expected an integer (int64), found true"),
        ('{"user_id": "USER", "item_id": ITEM}', 'found "USER" (a string)'),
        (
            '{"user_id": null, "item_id": ITEM}',
            "user_id': expected an integer (int64), found null (1 more",
        ),
        ('{"user_id": [USER], "item_id": ITEM}', "found [USER] (a list)"),
        (
            '{"user_id": USER, "item_id": 9223372036854775808}',
            "field 'item_id': expected an integer in int64's range "
            "-9223372036854775808..9223372036854775807, found 9223372036854775808",
        ),
        ('{"user_id": USER}', "field 'item_id' missing; every line needs ['user_id', 'item_id']"),
        ("[USER, ITEM]", 'expected a JSON object like {"user_id": ..., "item_id": ...}, found ['),
        ('{"user_id": USER, "item_id": ', "found malformed JSON (Expecting value at column"),
    ],
)
def test_a_bad_line_is_refused_with_its_number_field_and_value(artifact, tmp_path, bad, expected):
    _, user, item, _ = artifact
    good = json.dumps({"user_id": user, "item_id": item})
    for key, value in {"USER": str(user), "ITEM": str(item)}.items():
        bad, expected = bad.replace(key, value), expected.replace(key, value)
    # a good line, a blank line (counted), the bad line (line 3), a good one, another bad one
    text = f"{good}\n\n{bad}\n{good}\n" + '{"user_id": 1, "item_id": 2.0}\n'
    done = predict(artifact, tmp_path, text)
    assert done.returncode == 10, (done.stdout, done.stderr)
    assert done.stdout == ""  # nothing served, not even the good line before it
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith("error: --input in.jsonl: line 3: "), lines[0]
    assert expected in lines[0], lines[0]
    assert lines[0].endswith(
        "(1 more bad line after it); fix the input and rerun (nothing was predicted)"
    )


def test_a_missing_input_file_is_not_found_in_one_line(artifact, tmp_path):
    done = predict(artifact, tmp_path, None, name="nope.jsonl")
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: --input nope.jsonl: expected a JSON lines file (one object per line), "
        "found no such file; check the path, or omit --input to read stdin"
    ]


def test_the_library_refuses_floats_and_bools_too(artifact):
    path, user, item, _ = artifact
    predictor = export.load_inference(path, allow_untrusted=True)
    assert predictor(user_id=[user], item_id=[item])["known"].tolist() == [True]
    with pytest.raises(
        FormatError, match=r"input user_id\[1\]: expected an integer .* \(a float\)"
    ):
        predictor(user_id=[user, user + 0.5], item_id=[item, item])
    with pytest.raises(FormatError, match=r"input item_id\[0\]: .*found true \(a boolean\)"):
        predictor(user_id=[user], item_id=[True])
    with pytest.raises(FormatError, match="expected a tensor of int64, found torch.float32"):
        predictor(user_id=torch.tensor([1.5]), item_id=torch.tensor([item]))
