"""The slow store of ``make bench-tiers``: a real FUSE mount that throttles, and a run's
checkpoints committed and resumed through it."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

from recovery.config import CheckpointConfig
from recovery.format.layout import scan
from recovery.run.checkpointer import Checkpointer
from tests import system
from tests.conftest import record_and_save, tiny_state

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def slowstore():
    """``benchmarks/slowstore.py`` (the benchmarks are scripts, not a package)."""
    system.require(system.FUSE, to_run=False)
    spec = importlib.util.spec_from_file_location("slowstore", ROOT / "benchmarks" / "slowstore.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    lacking = module.missing()
    if lacking is not None:
        pytest.skip(f"{system.PREFIX}{system.FUSE.label}: {system.FUSE.install} ({lacking})")
    return module


def test_the_slow_store_carries_bytes_no_faster_than_its_link_and_unmounts(tmp_path):
    store = slowstore()
    data = os.urandom(2_000_000)
    with store.mounted(tmp_path / "backing", tmp_path / "mount", 10) as mount:
        began = time.monotonic()
        with open(mount / "f", "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        assert time.monotonic() - began >= 0.19  # 2 MB over 10 MB/s: at least 0.2 s
        began = time.monotonic()
        assert (mount / "f").read_bytes() == data  # read back across the link too
        assert time.monotonic() - began >= 0.19
        os.rename(mount / "f", mount / "g")
        assert os.listdir(mount) == ["g"]
    assert not os.path.ismount(tmp_path / "mount")
    assert (tmp_path / "backing" / "g").read_bytes() == data


def test_checkpoints_commit_and_resume_through_the_slow_store(tmp_path, signer, trust, prov):
    """The commit protocol as it is (no symlink followed, renames by directory descriptor,
    directories fsynced, the writer's lock) on a FUSE file system."""
    store = slowstore()
    kw = {"signer": signer, "trust": trust, "provenance": prov, "preemption": False}
    with store.mounted(tmp_path / "backing", tmp_path / "mount", 200) as mount:
        state = tiny_state()
        with Checkpointer(CheckpointConfig(every_steps=2), mount / "run", final_step=6, **kw) as ck:
            ck.restore(state)
            record_and_save(ck, state, range(1, 5))
        assert [s for s, _ in scan(mount / "run").committed] == [2, 4]
        state = tiny_state()
        with Checkpointer(CheckpointConfig(every_steps=2), mount / "run", final_step=6, **kw) as ck:
            assert ck.restore(state, "latest") == 4
