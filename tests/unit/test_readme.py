"""The README must keep telling the truth about the commands, keys and exit codes."""

import re
from pathlib import Path

from recovery import cli

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_two_commands():
    assert "make demo" in README and "make test" in README


def test_the_fast_loop_is_documented_and_is_a_make_target():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "`make test-fast`" in README and "\ntest-fast:" in makefile
    assert "--durations=30" in makefile and "lint included" in makefile


def test_every_exit_code_is_documented():
    table = dict(re.findall(r"^\| (\d+) \| (.+) \|$", README, flags=re.M))
    for _, code, _ in cli.EXIT_CODES:
        assert str(code) in table, f"exit code {code} missing from README"


def test_public_config_keys_are_documented():
    for key in (
        "recipe=",
        "seed=",
        "train.steps=",
        "checkpoint.root=",
        "checkpoint.every_steps=",
        "checkpoint.keep_last=",
        "checkpoint.keep_every=",
        "run.name=",
        "+resume=",
    ):
        assert f"`{key}`" in README, key


def test_cli_subcommands_are_documented():
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    for name in sub.choices:
        assert f"recovery {name}" in README


def test_every_key_of_the_health_and_dist_groups_is_documented():
    import yaml

    conf = Path(__file__).resolve().parents[2] / "conf"
    for group in ("health", "dist", "signing"):
        keys = yaml.safe_load((conf / group / "default.yaml").read_text())
        for key in keys:
            assert f"`{group}.{key}=`" in README, f"{group}.{key}"


def test_the_layout_section_lists_the_import_contracts_layers_in_order():
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    section = README[README.index("## Layout of the code") :]
    where = []
    for layer in layers:
        for module in (m.strip() for m in layer.split("|")):
            name = module.removeprefix("recovery.")
            hits = [section.find(f"recovery/{name}/"), section.find(f"recovery/{name}.py")]
            hits += [section.find(f", {name}.py")]
            found = [h for h in hits if h >= 0]
            assert found, f"{module} (a layer of the import contract) is not in the README layout"
            where.append((min(found), module))
    assert [m for _, m in sorted(where)] == [m for _, m in where]


def test_every_differential_key_is_documented():
    import yaml

    conf = Path(__file__).resolve().parents[2] / "conf" / "checkpoint" / "default.yaml"
    for key in yaml.safe_load(conf.read_text())["differential"]:
        assert f"`checkpoint.differential.{key}=`" in README, key
