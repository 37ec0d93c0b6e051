"""torchrun jobs (gloo on CPU): one consistent snapshot, exact resume, resharding, a dead rank."""

from __future__ import annotations

import json
import re
import shutil
import signal
import statistics
from html import unescape

import pytest
import torch

from recipes.embedding import DotProduct
from recovery import cli
from recovery.format.layout import DISTRIBUTED, METRICS_FILE, scan, step_dir_name
from recovery.integrity.keys.trust import KEY_ENV
from recovery.integrity.reads import reader
from recovery.parallel import sharded
from recovery.run.journal import effective_steps, read
from recovery.run.restoring import choose
from recovery.tools.drill import flat_tensors
from tests.integration.conftest import SMALL, STEPS

# SMALL's model: 200 users, 100 items, dim 32; checkpoints every 10 steps, the last 3 kept
USERS, ITEMS, DIM = 200, 100, 32


def model_and_optimizer(step_dir, trust):
    """A distributed checkpoint's full model and optimizer, read through DCP in this process."""
    loaded = choose.load(step_dir, trust)
    model = DotProduct(USERS, ITEMS, DIM, 0.1)
    opt = torch.optim.Adam(model.parameters())
    groups = loaded.decoded.meta[DISTRIBUTED]["optimizer"]
    sharded.load(model, opt, loaded.files, groups, where=step_dir)
    return loaded, model.state_dict(), opt.state_dict()


def assert_same_job(reference, run_dir, trust, *, ranks):
    ref = effective_steps(reference / METRICS_FILE)
    got = effective_steps(run_dir / METRICS_FILE)
    assert sorted(got) == sorted(ref) == list(range(1, STEPS + 1))
    for step in ref:
        for key in ("loss", "lr", "epoch", "batch", "update"):
            assert got[step][key] == ref[step][key], f"step {step}: {key} differs"
    final = step_dir_name(STEPS)
    a, model_a, opt_a = model_and_optimizer(reference / final, trust)
    b, model_b, opt_b = model_and_optimizer(run_dir / final, trust)
    for key in model_a:
        assert torch.equal(model_a[key], model_b[key]), f"model {key} differs"
    flat_a, flat_b = flat_tensors(opt_a["state"]), flat_tensors(opt_b["state"])
    assert flat_a.keys() == flat_b.keys() and flat_a
    for key in flat_a:
        assert torch.equal(flat_a[key], flat_b[key]), f"optimizer {key} differs"
    for name in ("sampler", "scheduler", "health"):
        assert a.decoded.tree[name] == b.decoded.tree[name], name
    for rank in range(ranks):
        rng_a = sharded.read_rank(a.files, rank, where=a.path)["rng"]
        rng_b = sharded.read_rank(b.files, rank, where=b.path)["rng"]
        assert torch.equal(rng_a["torch"], rng_b["torch"]), f"rank {rank} torch RNG differs"
        assert rng_a["python"] == rng_b["python"], f"rank {rank} python RNG differs"


@pytest.mark.key
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_two_rank_job_killed_and_resumed_is_bit_identical(
    strategy, job, trainer, tmp_path, trust
):
    reference = job(strategy, 2)
    victim = tmp_path / "victim"
    killed = trainer(victim, f"dist.strategy={strategy}", nproc=2, pause_at="step-35")
    assert killed.returncode != 0
    assert [s for s, _ in scan(victim / "r").committed] == [10, 20, 30]
    if strategy == "ddp":  # every rank compares its redone steps with the dead job's journal
        broken = tmp_path / "broken"
        shutil.copytree(victim, broken)
        journal = broken / "r" / METRICS_FILE  # as if the dead job had trained otherwise
        lines = [json.loads(line) for line in journal.read_text().splitlines()]
        for rec in lines:
            if rec.get("step") == 32 and "event" not in rec:
                rec["loss"] += 1e-9
        journal.write_text("".join(json.dumps(r) + "\n" for r in lines))
        inexact = trainer(broken, "+resume=latest", nproc=2)
        assert inexact.returncode == 0, inexact.output
        for rank in ("", "rank 1: "):
            assert f"{rank}INEXACT RESUME at step 32 (resumed from step 30): loss" in inexact.output
    resumed = trainer(victim, f"dist.strategy={strategy}", "+resume=latest", nproc=2)
    assert resumed.returncode == 0, resumed.output
    assert "RESUMED run" in resumed.output and "resharded" not in resumed.output
    checks = [r for r in read(victim / "r" / METRICS_FILE) if r.get("event") == "resume_check"]
    assert [(c["status"], c["identical"]) for c in checks] == [("exact", 5)]
    assert_same_job(reference, victim / "r", trust, ranks=2)
    final = choose.load(victim / "r" / step_dir_name(STEPS), trust)
    spread = final.decoded.meta[DISTRIBUTED]
    assert spread["world_size"] == 2 and spread["strategy"] == strategy
    assert final.manifest.recovery["world_size"] == 2
    names = {rec.name for rec in final.manifest.files}
    assert {"dcp/.metadata", "ranks/rank-00000.json", "ranks/rank-00001.safetensors"} <= names
    assert not any(n.startswith("model") for n in names)  # the weights are in dcp/ only


@pytest.fixture(scope="module")
def seed_band(job):
    """Run-to-run spread of the mean loss over steps 61-80 across seeds (single process)."""
    means = []
    for seed in range(4):
        steps = effective_steps(job(None, 1, seed=seed) / METRICS_FILE)
        means.append(statistics.fmean(steps[s]["loss"] for s in range(61, STEPS + 1)))
    return statistics.stdev(means)


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_resume_on_another_world_size_reshards_and_stays_in_the_seed_band(
    before, after, job, trainer, tmp_path, trust, signer, seed_band, capsys
):
    reference = job("fsdp", before)
    root = tmp_path / "resharded"
    shutil.copytree(reference.parent, root, ignore=shutil.ignore_patterns("*.log"))
    for step in (70, 80):
        shutil.rmtree(root / "r" / step_dir_name(step))
    resumed = trainer(root, "dist.strategy=fsdp", "+resume=latest", nproc=after)
    assert resumed.returncode == 0, resumed.output
    assert f"saved by {before} rank(s), resumed on {after}" in resumed.output
    ref = effective_steps(reference / METRICS_FILE)
    got = effective_steps(root / "r" / METRICS_FILE)
    # the schedule and the global data cursor continue exactly; only the RNG was reseeded
    for step in range(61, STEPS + 1):
        for key in ("lr", "epoch", "batch"):
            assert got[step][key] == ref[step][key], f"step {step}: {key} differs"
    assert any(got[s]["loss"] != ref[s]["loss"] for s in range(61, STEPS + 1))
    gap = abs(
        statistics.fmean(got[s]["loss"] for s in range(61, STEPS + 1))
        - statistics.fmean(ref[s]["loss"] for s in range(61, STEPS + 1))
    )
    assert gap <= 3 * seed_band, f"loss moved {gap:.4f}; seed-to-seed spread {seed_band:.4f}"

    final = root / "r" / step_dir_name(STEPS)
    head = choose.load(final, trust)
    assert head.manifest.recovery["world_size"] == after
    assert head.manifest.recovery["provenance"]["resharded"]["from"] == before
    [seg] = [s for s in head.manifest.recovery["lineage"] if s["kind"] == "resume"]
    assert seg["resharded"] == {
        "from": before,
        "to": after,
        "rng": "reseeded from (seed, step, rank)",
    }
    assert seg["world_size"] == after and seg["at_step"] == 60

    capsys.readouterr()
    assert cli.main(["audit", str(final), "--trusted", str(signer.path.parent)]) == 0
    text = capsys.readouterr().out
    assert f"world {after}" in text and f"world {before}" in text
    assert f"resharded {before}->{after} ranks" in text
    assert cli.main(["audit", str(final), "--json", "--trusted", str(signer.path.parent)]) == 0
    links = json.loads(capsys.readouterr().out)["links"]
    [hop] = [link for link in links if link["relation"] == "resume"]
    assert hop["world_size"] == before and hop["resharded"]["to"] == after


def test_a_rank_killed_mid_save_commits_nothing_and_the_job_resumes(job, trainer, tmp_path, trust):
    """Rank 1 SIGKILLed while writing its files of step 30 (``rank-1-write-30``), then, in
    the job resumed from there, once its shard of step 40 is written (``rank-1-sharded-40``):
    neither step is committed, each resume removes the abandoned write and continues from
    the newest committed step, and the job ends bit-identical (one job per kill point)."""
    reference = job("ddp", 2)
    root = tmp_path / "job"
    killed = trainer(root, nproc=2, pause_at="rank-1-write-30", kill_marked_rank=True, timeout=240)
    assert killed.returncode != 0
    listing = scan(root / "r")
    assert [s for s, _ in listing.committed] == [10, 20]  # step 30 never committed
    assert listing.stale, "the abandoned write stays as an unsigned temp directory"
    killed = trainer(
        root,
        "+resume=latest",
        nproc=2,
        pause_at="rank-1-sharded-40",
        kill_marked_rank=True,
        timeout=240,
    )
    assert killed.returncode != 0
    assert "RESUMED run" in killed.output and "step-00000020" in killed.output
    assert "removing" in killed.output and "never committed" in killed.output
    listing = scan(root / "r")
    assert [s for s, _ in listing.committed] == [10, 20, 30]  # step 40 never committed
    assert listing.stale, "the abandoned write stays as an unsigned temp directory"
    resumed = trainer(root, "+resume=latest", nproc=2)
    assert resumed.returncode == 0, resumed.output
    assert "RESUMED run" in resumed.output and "step-00000030" in resumed.output
    assert "removing" in resumed.output and "never committed" in resumed.output
    assert_same_job(reference, root / "r", trust, ranks=2)


def test_each_rank_verifies_the_shards_it_reads_and_a_damaged_one_falls_back(
    job, trainer, tmp_path, trust
):
    """Rank 1's DCP shard of the newest checkpoint is damaged (same size, one byte): the
    size checks pass, rank 1 finds it when DCP reads it, every rank skips that
    checkpoint together, and the job resumes from the one before, ending identical."""
    reference = job("fsdp", 2)
    root = tmp_path / "damaged"
    shutil.copytree(reference.parent, root, ignore=shutil.ignore_patterns("*.log"))
    shutil.rmtree(root / "r" / step_dir_name(80))
    shard = root / "r" / step_dir_name(70) / "dcp" / "__1_0.distcp"
    shard.chmod(0o644)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    resumed = trainer(root, "dist.strategy=fsdp", "+resume=latest", nproc=2)
    assert resumed.returncode == 0, resumed.output
    # found as DCP read it (the eager verification, which reads every byte, passed it)
    assert "RESUME FALLBACK: skipping" in resumed.output and "read by DCP" in resumed.output
    assert "__1_0.distcp" in resumed.output and "failed verification" not in resumed.output
    assert "RESUMED run" in resumed.output and "step-00000060" in resumed.output
    assert_same_job(reference, root / "r", trust, ranks=2)


def test_a_plain_process_resumes_a_two_rank_checkpoint_and_reports_both_world_sizes(
    job, trainer, tmp_path, trust, signer, capsys
):
    """One process resumes the 2-rank job's step 60 (70 and 80 lost); ``recovery report``
    of the run shows both world sizes and the resharded resume."""
    reference = job("fsdp", 2)
    root = tmp_path / "plain"
    shutil.copytree(reference.parent, root, ignore=shutil.ignore_patterns("*.log"))
    for step in (70, 80):
        shutil.rmtree(root / "r" / step_dir_name(step))
    resumed = trainer(root, "+resume=latest")
    assert resumed.returncode == 0, resumed.output
    assert "saved by 2 rank(s), resumed on 1" in resumed.output
    final = choose.load(root / "r" / step_dir_name(STEPS), trust)
    assert DISTRIBUTED not in final.decoded.meta and "model" in final.decoded.tree
    assert final.manifest.recovery["world_size"] == 1

    page = tmp_path / "report.html"
    capsys.readouterr()
    code = cli.main(["report", str(root / "r"), "--out", str(page),
                     "--trusted", str(signer.path.parent)])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    html = page.read_text()
    text = re.sub(r"\s+", " ", unescape(re.sub(r"<[^>]+>", " ", html)))
    assert "world size 1, 2" in text
    assert "1 (resharded 2->1)" in text  # the resumes table
    # the lineage edge (its drift: the job's dist.strategy, which this resume leaves out)
    assert re.search(r"resume \((drift: [^;)]*; )?2->1 ranks\)", text), text
    assert "world 2 ranks" in html  # the 2-rank checkpoint's node


def test_a_two_rank_checkpoint_exports_and_warm_starts_a_new_run(
    job, trainer, tmp_path, trust, signer, data_root, monkeypatch
):
    from recovery import cli
    from recovery.tools.export import load_inference

    reference = job("ddp", 2)
    monkeypatch.setenv(KEY_ENV, str(signer.path))
    out = tmp_path / "artifact"
    code = cli.main(
        [
            "export",
            f"checkpoint.root={reference.parent}",
            f"recipe.data.root={data_root}",
            *SMALL,
            f"export.out={out}",
        ]
    )
    assert code == 0
    predictor = load_inference(out, trust)
    assert predictor.inputs == ["user_id", "item_id"]
    art = reader.read_manifest(out, trust)
    assert art.purpose == "inference" and art.recovery["lineage"][-1]["kind"] == "export"

    started = trainer(
        tmp_path / "warm", f"+init_from={reference / step_dir_name(STEPS)}", "run.name=w"
    )
    assert started.returncode == 0, started.output
    assert "warm start" in started.output and "initialised from" in started.output


def test_sigterm_to_a_torchrun_job_checkpoints_every_rank_at_one_step(
    job, trainer, tmp_path, trust
):
    reference = job("ddp", 2)
    root = tmp_path / "preempted"
    # torchrun's agent gets SIGTERM (as from a scheduler) and forwards it to every rank
    stopped = trainer(root, nproc=2, pause_at="step-25", signals=(signal.SIGTERM,))
    assert stopped.returncode != 0
    assert stopped.output.count("preempted: SIGTERM: checkpointed step 26") == 2  # both ranks
    assert [s for s, _ in scan(root / "r").committed] == [10, 20, 26]
    resumed = trainer(root, "+resume=latest", nproc=2)
    assert resumed.returncode == 0, resumed.output
    assert_same_job(reference, root / "r", trust, ranks=2)
