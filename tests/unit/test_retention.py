"""Retention on disk: the policy applied, and the kept best an independent, verifiable copy."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from recovery.format.layout import BEST_DIR, scan, step_dir_name
from recovery.integrity.commits import commit
from recovery.integrity.reads import reader
from recovery.run.restoring import choose
from recovery.run.saving import retention
from tests import launcher
from tests.conftest import commit_state, tiny_state


def committed(run_dir, step, value, signer, *, nested=False):
    final = run_dir / step_dir_name(step)
    tmp = final.with_name(final.name + ".tmp-0a1b2c")
    adopt = []
    tmp.mkdir(parents=True)
    if nested:  # a distributed checkpoint's layout: files in subdirectories
        (tmp / "dcp").mkdir()
        (tmp / "dcp" / "__0_0.distcp").write_bytes(b"shard")
        adopt.append("dcp/__0_0.distcp")
    mf = commit.commit(
        final,
        {"state.json": b"{}"},
        {"step": step, "metrics": {"val": value}},
        signer=signer,
        tmp=tmp,
        adopt=adopt,
    )
    for path in final.rglob("*"):
        if path.is_file():
            path.chmod(0o444)
    return final, mf


def test_the_best_copy_of_a_nested_checkpoint_verifies_and_survives_its_source(
    tmp_path, signer, trust
):
    run = tmp_path / "run"
    first, mf = committed(run, 10, 0.5, signer, nested=True)
    kept = dict(metric="val", mode="min", trust=trust, allow_untrusted=False)
    assert retention.keep_best(run, first, mf, **kept)
    best = run / BEST_DIR / first.name
    assert reader.read_verified(best, trust).manifest.step == 10
    assert (best / "dcp").stat().st_mode & 0o111  # still a traversable directory
    assert (best / "dcp" / "__0_0.distcp").stat().st_nlink == 1  # a copy, not a link

    worse, mf_worse = committed(run, 20, 0.7, signer)
    assert not retention.keep_best(run, worse, mf_worse, **kept)
    better, mf_better = committed(run, 30, 0.1, signer)
    assert retention.keep_best(run, better, mf_better, **kept)
    assert [p.name for p in (run / BEST_DIR).iterdir()] == [step_dir_name(30)]

    removed = retention.retain(run, 30, keep_last=2, keep_every=0)
    assert removed == [first]
    assert sorted(p.name for p in run.glob("step-*")) == [step_dir_name(20), step_dir_name(30)]


KILL_BEST = """
import sys
from pathlib import Path
from recovery.integrity.reads import reader
from recovery.integrity.keys.signing import TrustStore
from recovery.run.saving import retention
run_dir, final, keys = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
trust = TrustStore.from_paths([keys])
mf = reader.read_manifest(final, trust)
retention.keep_best(run_dir, final, mf, metric="loss", mode="min", trust=trust,
                    allow_untrusted=False)
"""


@pytest.mark.parametrize(("phase", "best_after"), [("copy", 2), ("swap", 4)])
def test_a_kill_during_the_best_copy_always_leaves_one_committed_best(
    tmp_path, signer, trust, phase, best_after
):
    run_dir = tmp_path / "run"
    for step, loss in ((2, 1.0), (4, 0.5)):
        commit_state(run_dir, tiny_state(), step, signer, metrics={"loss": loss})
    two = run_dir / step_dir_name(2)
    retention.keep_best(
        run_dir,
        two,
        reader.read_manifest(two, trust),
        metric="loss",
        mode="min",
        trust=trust,
        allow_untrusted=False,
    )
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "k.pub").write_bytes(signer.public_pem)
    mark = tmp_path / "mark"
    env = {**os.environ, "RECOVERY_PAUSE_AT": f"best-{phase}-4", "RECOVERY_PAUSE_MARK": str(mark)}
    proc = launcher.Popen(
        [sys.executable, "-c", KILL_BEST, str(run_dir), str(run_dir / step_dir_name(4)), str(keys)],
        env=env,
    )
    deadline = time.time() + 60
    while not mark.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert mark.read_text().startswith(f"best-{phase}-4")

    chosen = choose.select(run_dir, "best", trust)  # never the temp dir, always a committed one
    assert chosen is not None and chosen.decoded.step == best_after
    retention.tidy_best(run_dir)  # what a starting writer does
    listing = scan(run_dir / BEST_DIR)
    assert [s for s, _ in listing.committed] == [best_after] and not listing.stale


@pytest.mark.parametrize(
    ("keep_best", "metric", "metrics", "refused"),
    [
        (False, None, None, False),
        (True, "val_loss", {"loss": 1.0, "val_loss": 0.5}, False),
        (True, "val_logloss", {"loss": 1.0, "val_loss": 0.5}, True),
        (True, "val_loss", None, True),
        (True, "name", {"name": "not a number"}, True),
    ],
)
def test_an_unknown_best_metric_is_refused_naming_those_recorded(
    keep_best, metric, metrics, refused
):
    from recovery.config import CheckpointConfig
    from recovery.errors import ConfigError

    cfg = CheckpointConfig(keep_best=keep_best, best_metric=metric)
    if not refused:
        retention.check_metric(cfg, metrics)
        return
    with pytest.raises(ConfigError, match=r"checkpoint\.best_metric=.*it records"):
        retention.check_metric(cfg, metrics)
