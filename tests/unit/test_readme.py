"""The README and the docs must keep telling the truth about the commands, keys and exit codes."""

import re
from pathlib import Path

from recovery import cli

TOP = Path(__file__).resolve().parents[2]
README = (TOP / "README.md").read_text()


def page(name: str) -> str:
    """The text of ``docs/<name>``."""
    return (TOP / "docs" / name).read_text()


def python_block(text: str) -> str:
    """The first ```python block of ``text`` (its info string may carry a title)."""
    return re.split(r"^```python[^\n]*\n", text, maxsplit=1, flags=re.M)[1].split("```", 1)[0]


def test_two_commands():
    assert "make demo" in README and "make test" in README


def test_the_fast_loop_is_documented_and_is_a_make_target():
    makefile = (TOP / "Makefile").read_text()
    assert "`make test-fast`" in README and "`make test-fast`" in page("dev/tests.md")
    assert "\ntest-fast:" in makefile
    assert "--durations=30" in makefile and "lint included" in makefile


def test_every_exit_code_is_documented():
    # the CLI page holds every code and case; the README shows the few a job script acts
    # on, each a real code, and links to the whole table
    table = dict(re.findall(r"^\| (\d+) \| (.+) \|$", page("cli.md"), flags=re.M))
    codes = {str(code) for _, code, _ in cli.EXIT_CODES} | {"0", "2"}
    assert codes <= set(table), f"exit codes missing from docs/cli.md: {codes - set(table)}"
    short = re.findall(r"^\| (\d+) \|", README.split("## Exit codes", 1)[1], flags=re.M)
    assert {"0", "12", "75"} <= set(short) <= codes, short
    assert "(docs/cli.md#exit-codes)" in README


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
        assert f"`{key}`" in page("config.md"), key


def test_cli_subcommands_are_documented():
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command")
    for name in sub.choices:
        assert f"recovery {name}" in page("cli.md"), name


def test_every_key_of_the_health_and_dist_groups_is_documented():
    import yaml

    conf = TOP / "conf"
    for group in ("health", "dist", "signing"):
        keys = yaml.safe_load((conf / group / "default.yaml").read_text())
        for key in keys:
            assert f"`{group}.{key}=`" in page("config.md"), f"{group}.{key}"


def test_the_layout_section_lists_the_import_contracts_layers_in_order():
    import tomllib

    pyproject = TOP / "pyproject.toml"
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    layered = [c for c in contracts if c["type"] == "layers"]
    assert [c.get("containers", []) for c in layered] == [[], ["recovery.run"]]
    section = page("dev/layout.md")
    for contract in layered:
        (container,) = contract.get("containers", ["recovery"])
        where = []
        for layer in contract["layers"]:
            for module in (m.strip() for m in layer.split("|")):
                module = module if module.startswith("recovery.") else f"{container}.{module}"
                path = module.replace(".", "/")
                hits = [section.find(f"{path}/"), section.find(f"{path}.py")]
                hits += [section.find(f", {path.rsplit('/', 1)[1]}.py")]
                found = [h for h in hits if h >= 0]
                assert found, f"{module} (a layer of an import contract) is not in layout.md"
                where.append((min(found), module))
        assert [m for _, m in sorted(where)] == [m for _, m in where], contract["name"]


def test_every_differential_key_is_documented():
    import yaml

    conf = TOP / "conf" / "checkpoint" / "default.yaml"
    for key in yaml.safe_load(conf.read_text())["differential"]:
        assert f"`checkpoint.differential.{key}=`" in page("config.md"), key


def test_the_epoch_end_pattern_runs_and_steps_the_scheduler_before_each_epochs_save(tmp_path):
    import torch

    from recovery import CheckpointConfig, Checkpointer, ResumableLoader, TrainState

    code = python_block(page("own-loop.md").split("**Work at an epoch's end.**", 1)[1])
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    loader = ResumableLoader(torch.utils.data.TensorDataset(torch.ones(6, 2)), 2, seed=0)
    state = TrainState(model=model, optimizer=opt, scheduler=sched, sampler=loader)

    def train_step(x: torch.Tensor, y: None = None) -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    # one epoch is 3 batches: the checkpoint of step 3 holds the scheduler stepped once
    with Checkpointer(CheckpointConfig(every_steps=3), tmp_path / "run", final_step=3) as ckpt:
        ns = {"loader": _Pairs(loader), "ckpt": ckpt, "state": state, "sched": sched,
              "train_step": train_step, "step": ckpt.restore(state, "latest")}  # fmt: skip
        exec(code, ns)
    assert ns["step"] == 3 and sched.last_epoch == 1
    saved = state_at(tmp_path / "run", 3)
    assert saved["scheduler"]["last_epoch"] == 1


class _Pairs:
    """The loader as ``(x, y)`` pairs, ``epoch_ended`` passed through."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __iter__(self):
        for (x,) in self.loader:
            yield x, None

    @property
    def epoch_ended(self) -> bool:
        return self.loader.epoch_ended


def state_at(run_dir, step):
    from recovery.format.layout import step_dir_name
    from recovery.integrity.keys.signing import TrustStore
    from recovery.run.restoring import choose

    path = run_dir / step_dir_name(step)
    return choose.load(path, TrustStore([]), allow_untrusted=True).decoded.tree


def test_every_trackers_key_is_documented():
    import yaml

    conf = TOP / "conf" / "trackers" / "default.yaml"
    text = page("trackers.md")
    for tracker, keys in yaml.safe_load(conf.read_text()).items():
        for key in keys:
            assert f"`trackers.{tracker}.{key}=`" in text, f"trackers.{tracker}.{key}"


def test_the_own_loop_trackers_example_runs_and_writes_tensorboard_events(tmp_path):
    import pytest

    pytest.importorskip("tensorboard")
    import torch
    from tensorboard.backend.event_processing import event_accumulator as ea

    from recovery import TrainState

    code = python_block(page("trackers.md").split("| key | default | meaning |", 1)[1])
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    absent = {"scheduler": "a constant rate", "sampler": "no data"}
    ns = {"tmp": tmp_path, "state": TrainState(model=model, optimizer=opt, absent=absent)}
    exec(code, ns)
    acc = ea.EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3, 4]
    assert [e.step for e in acc.Scalars("checkpoint/write_s")] == [2, 4]
