import hashlib
import json
import os
import subprocess

import pytest

import recovery
from recovery import cli, errors
from recovery.format.layout import step_dir_name
from tests import launcher
from tests.conftest import commit_state, tiny_state


def test_public_surface_is_pinned():
    assert sorted(recovery.__all__) == sorted(
        [
            "CheckpointConfig",
            "CheckpointNotFoundError",
            "Checkpointer",
            "ClusterConfig",
            "CommitError",
            "ConfigError",
            "HealthConfig",
            "HealthMonitor",
            "IncompatibleStateError",
            "InexactResumeError",
            "Journal",
            "LoopState",
            "MlflowConfig",
            "Preempted",
            "PreemptionGuard",
            "PurposeError",
            "RecoveryError",
            "ResumableLoader",
            "ResumableSampler",
            "ResumeCheckConfig",
            "RunConfig",
            "Stateful",
            "TensorBoardConfig",
            "TrainConfig",
            "TrainState",
            "TrackersConfig",
            "VerificationError",
            "attach_trackers",
            "load_inference",
            "read_verified",
            "select",
        ]
    )
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    assert sorted(sub.choices) == [
        "audit",
        "drill",
        "export",
        "import",
        "inspect",
        "keygen",
        "ls",
        "plan",
        "predict",
        "report",
        "sync",
        "verify",
    ]


CLI_FLAGS = {
    "audit": ["--allow-untrusted", "--format", "--json", "--root", "--trusted", "path"],
    "drill": [
        "--allow-untrusted",
        "--dvc",
        "--json",
        "--kills",
        "--out",
        "--preflight",
        "--script",
        "--seed",
        "--timeout",
        "--trusted",
        "overrides",
    ],
    "export": ["--json", "overrides"],
    "import": ["--json", "--key", "--model-config", "--out", "--strip-prefix", "src"],
    "inspect": ["--allow-untrusted", "--json", "--trusted", "path"],
    "keygen": ["--force", "--json", "--out"],
    "ls": ["--allow-untrusted", "--json", "--trusted", "run_dir"],
    "plan": ["--async", "--cost", "--host-loss", "--intervals", "--json", "--local-cost", "--mtbf"],
    "predict": ["--allow-untrusted", "--input", "--json", "--trusted", "artifact"],
    "report": [
        "--allow-untrusted",
        "--export",
        "--json",
        "--mtbf",
        "--out",
        "--reference",
        "--root",
        "--trusted",
        "run_dir",
    ],
    "sync": ["--json", "--push", "--remote", "--timeout", "run_dir"],
    "verify": ["--allow-untrusted", "--json", "--trusted", "path"],
}


def test_every_subcommands_flags_are_pinned():
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    found = {
        name: sorted(
            a.option_strings[0] if a.option_strings else a.dest
            for a in p._actions
            if a.dest != "help"
        )
        for name, p in sub.choices.items()
    }
    assert found == CLI_FLAGS


def test_exit_codes_are_distinct_and_cover_every_error():
    codes = [code for _, code, _ in cli.EXIT_CODES]
    assert len(codes) == len(set(codes))
    classes = {c for c, _, _ in cli.EXIT_CODES}
    declared = {
        v
        for v in vars(errors).values()
        if isinstance(v, type) and issubclass(v, errors.RecoveryError)
    }
    assert declared - classes == set()


def test_every_error_class_is_raised_somewhere_and_every_code_is_documented():
    # "reachable": each class in the table is raised by some code path of the library
    # (a class only ever caught would be a row no user can meet); the two bases are the
    # fallbacks for a subclass without a row of its own (1 and 15), never raised as such
    fallbacks = {errors.RecoveryError, errors.VerificationError}
    import re
    from pathlib import Path

    import recovery as package

    top = Path(package.__file__).parents[1]
    # the library, and the project's exporter (export's parity check is the project's code)
    files = [*Path(package.__file__).parent.rglob("*.py"), *(top / "recipes").glob("*.py")]
    source = "\n".join(p.read_text() for p in files)
    table = (top / "docs" / "cli.md").read_text()  # the full table; the README links to it
    for cls, code, _ in cli.EXIT_CODES:
        if cls in fallbacks:
            assert f"\n| {code} |" in table, code
            continue
        assert re.search(rf"(raise|return) (errors\.)?{cls.__name__}\(", source), cls.__name__
        assert f"\n| {code} |" in table, code


def trusted(signer):
    return ["--trusted", str(signer.path.parent)]


def test_verify_ok_and_json(checkpoint, capsys, signer):
    path, _ = checkpoint
    assert cli.main(["verify", str(path), "--json", *trusted(signer)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["step"] == 3 and out["purpose"] == "continuation"


@pytest.mark.parametrize(
    ("damage", "code"),
    [
        (
            lambda p: (p / "model.safetensors").write_bytes(
                b"x" * (p / "model.safetensors").stat().st_size
            ),
            9,
        ),
        (lambda p: os.truncate(p / "state.json", 3), 8),
        (lambda p: (p / "rng.safetensors").unlink(), 6),
        (lambda p: (p / "extra").write_text("x"), 7),
        (lambda p: (p / "model.sig").unlink(), 4),
    ],
)
def test_verify_exit_code_per_damage(checkpoint, capsys, signer, damage, code):
    path, _ = checkpoint
    damage(path)
    assert cli.main(["verify", str(path), *trusted(signer)]) == code
    assert str(path) in capsys.readouterr().err


def test_verify_missing_dir(tmp_path, capsys):
    assert cli.main(["verify", str(tmp_path / "nope")]) == 3


def test_inspect_and_ls(tmp_path, capsys, signer):
    state = tiny_state()
    commit_state(tmp_path, state, 2, signer)
    commit_state(tmp_path, state, 4, signer)
    (tmp_path / "step-00000006.tmp-abcdef").mkdir()
    (tmp_path / step_dir_name(4) / "state.json").write_text("{}")
    assert cli.main(["inspect", str(tmp_path / step_dir_name(2)), "--json", *trusted(signer)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["components"] == [
        "config",
        "model",
        "optimizer",
        "provenance",
        "rng",
        "sampler",
        "scheduler",
    ]
    assert len(info["parameters_sha256"]) == 64
    assert {f["name"] for f in info["files"]} >= {"model.safetensors", "state.json"}
    assert cli.main(["ls", str(tmp_path), "--json", *trusted(signer)]) == 8  # step 4 truncated
    rows = json.loads(capsys.readouterr().out)["checkpoints"]
    assert [(r["step"], r["verified"], r["status"]) for r in rows] == [
        (2, True, "ok"),
        (4, False, "TruncatedFileError"),
        (None, False, "partial"),
    ]
    assert cli.main(["ls", str(tmp_path), *trusted(signer)]) == 8
    out = capsys.readouterr().out
    assert "partial" in out and signer.key_id[:12] in out and "trusted" in out
    assert cli.main(["ls", str(tmp_path)]) == 17  # without the key: listed, not verified
    assert f"UNTRUSTED key {signer.key_id[:12]}" in capsys.readouterr().out


def test_parameters_digest_tracks_values():
    a = tiny_state().components["model"].state_dict()
    b = tiny_state().components["model"].state_dict()
    assert cli.parameters_digest(a) == cli.parameters_digest(b)
    b["0.bias"][0] += 1
    assert cli.parameters_digest(a) != cli.parameters_digest(b)


def test_untrusted_signer_exit_code_and_allow_flag(checkpoint, capsys, signer):
    path, _ = checkpoint
    assert cli.main(["verify", str(path)]) == 17
    assert "not in the trust store" in capsys.readouterr().err
    assert cli.main(["verify", str(path), "--allow-untrusted", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["signer"]["trusted"] is False


def test_keygen(tmp_path, capsys):
    out = tmp_path / "k"
    assert cli.main(["keygen", "--out", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (out / "recovery.key").stat().st_mode & 0o777 == 0o600
    assert (out / "recovery.key").read_text().startswith("-----BEGIN PRIVATE KEY-----")
    pem = subprocess.run(
        ["openssl", "pkey", "-pubin", "-in", str(out / "recovery.pub"), "-outform", "PEM"],
        capture_output=True,
        check=True,
    ).stdout  # the key id: sha256 of the key's canonical PEM, as openssl re-encodes it
    assert info["key_id"] == hashlib.sha256(pem).hexdigest()
    assert cli.main(["keygen", "--out", str(out)]) == 20
    assert "already exists" in capsys.readouterr().err


def test_plan_table(capsys):
    assert (
        cli.main(["plan", "--cost", "60s", "--mtbf", "24h", "--intervals", "10m,1h", "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    rows = {round(r["interval_s"], 2): r for r in out["rows"]}
    assert set(rows) == {600.0, 3600.0, 3219.94}
    assert (
        rows[3600.0]["checkpoint_cost_per_day_s"] == 1440
        and rows[3600.0]["loss_per_failure_s"] == 1800
    )
    assert rows[3219.94]["optimum"] and rows[3219.94]["young_daly"]
    assert not rows[600.0]["optimum"]
    assert cli.main(["plan", "--cost", "60s", "--mtbf", "24h"]) == 0
    text = capsys.readouterr().out
    assert "53.7m" in text and text.count("<- optimum") == 1


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["drill", "--timeout", "abc", "--", "python", "x.py"], "--timeout"),
        (["report", "run", "--mtbf", "soon"], "--mtbf"),
        (["sync", "run", "--timeout", "abc"], "--timeout"),
    ],
)
def test_every_bad_duration_is_a_usage_error(argv, option, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"error: argument {option}: expected a" in err, err


@pytest.mark.parametrize(
    ("argv", "option", "value"),
    [
        (["--cost", "abc", "--mtbf", "24h"], "--cost", "'abc'"),
        (["--cost", "60s", "--mtbf", "soon"], "--mtbf", "'soon'"),
        (["--cost=0s", "--mtbf", "24h"], "--cost", "positive"),
        (["--cost", "60s", "--mtbf", "24h", "--intervals", "5m,1x"], "--intervals", "'1x'"),
    ],
)
def test_a_bad_plan_value_is_a_bad_command_line(argv, option, value):
    """Exit 2 and argparse's usage error, as for any bad argument; 12 is for a bad config."""
    import sys
    from pathlib import Path

    exe = Path(sys.executable).parent / "recovery"
    done = launcher.run([str(exe), "plan", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.startswith("usage: recovery plan") and "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"recovery plan: error: argument {option}: expected a")
    assert value in last


@pytest.mark.parametrize(
    ("argv", "code", "names"),
    [
        (["keygen", "--out", "{file}"], 20, "is a file, not a directory"),
        (["keygen", "--out", "{file}/sub"], 20, "is not writable"),
        (["sync", "{tmp}/nowhere"], 3, "no such run directory"),
        (["verify", "{tmp}", "--trusted", "{tmp}/no-such.pub"], 12, "--trusted"),
    ],
)
def test_bad_input_gets_one_line_and_its_code(tmp_path, capsys, argv, code, names):
    (tmp_path / "afile").write_text("x")
    fill = {"file": str(tmp_path / "afile"), "tmp": str(tmp_path)}
    assert cli.main([a.format(**fill) for a in argv]) == code
    err = capsys.readouterr().err
    assert names in err and len(err.strip().splitlines()) == 1, err


def test_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert (
        done.value.code == 0
        and capsys.readouterr().out.strip() == f"recovery {recovery.__version__}"
    )


def test_a_reader_that_stops_early_ends_the_output_quietly():
    # `recovery ... | head`: the pipe closes under a long output; no traceback, exit 0
    import subprocess
    import sys
    from pathlib import Path

    intervals = ",".join(f"{i}s" for i in range(1, 20000))
    exe = Path(sys.executable).parent / "recovery"
    cmd = [str(exe), "plan", "--cost", "60s", "--mtbf", "24h", "--intervals", intervals]
    proc = launcher.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert "Traceback" not in err
