"""Under ``--json`` a failing command prints ``{"error": {code, name, message}}`` on stdout and
exits with the same code as without it; its one line still goes to stderr."""

from __future__ import annotations

import json

import pytest

from recovery import cli


@pytest.mark.parametrize("command", ["ls", "verify", "inspect", "audit"])
def test_a_missing_path_is_a_json_error_with_the_not_found_code(tmp_path, capsys, command):
    missing = tmp_path / "nowhere"
    assert cli.main([command, str(missing)]) == 3
    plain = capsys.readouterr()
    assert plain.out == "" and str(missing) in plain.err
    assert cli.main([command, str(missing), "--json"]) == 3
    out = capsys.readouterr()
    error = json.loads(out.out)["error"]
    assert error["code"] == 3 and error["name"] == "CheckpointNotFoundError"
    assert str(missing) in error["message"] and error["path"] == str(missing)
    assert out.err.strip() == plain.err.strip()


@pytest.mark.parametrize("command", ["verify", "inspect", "audit"])
def test_a_verification_failure_is_a_json_error_with_its_code(tmp_path, capsys, command):
    fake = tmp_path / "step-00000002"
    fake.mkdir()
    (fake / "state.json").write_text("{}")  # no model.sig: the manifest is missing
    code = cli.main([command, str(fake)])
    capsys.readouterr()
    assert code == 4
    assert cli.main([command, str(fake), "--json"]) == code
    error = json.loads(capsys.readouterr().out)["error"]
    assert (error["code"], error["name"]) == (4, "ManifestError")


def test_a_bad_command_line_under_json_is_a_json_usage_error(capsys):
    with pytest.raises(SystemExit) as ended:
        cli.main(["plan", "--cost", "soon", "--mtbf", "24h", "--json"])
    assert ended.value.code == 2
    out = capsys.readouterr()
    error = json.loads(out.out)["error"]
    assert (error["code"], error["name"]) == (2, "usage")
    assert "--cost" in error["message"] and "--cost" in out.err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["drill", "--json", "--", "/bin/true"], "has no {run_dir} argument"),
        (["drill", "--json", "--script", "x.py", "--", "cmd", "{run_dir}"], "--script"),
    ],
)
def test_the_drills_usage_errors_under_json_are_json(capsys, argv, said):
    try:
        code = cli.main(argv)
    except SystemExit as ended:  # argparse's own refusals end the process
        code = ended.code
    assert code == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == 2 and error["name"] == "usage" and said in error["message"]


def test_a_drill_that_kills_nothing_is_refused_in_one_line_as_a_config_error(capsys):
    assert cli.main(["drill", "--json", "--kills", "0"]) == 12
    out = capsys.readouterr()
    error = json.loads(out.out)["error"]
    assert error["code"] == 12 and "--kills" in error["message"] and "kills >= 1" in out.err
    assert len(out.err.strip().splitlines()) == 1
