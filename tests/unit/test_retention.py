"""Retention on disk: the policy applied, and the kept best an independent, verifiable copy."""

from __future__ import annotations

from recovery.format.layout import BEST_DIR, step_dir_name
from recovery.integrity import commit, reader
from recovery.run import retention


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
