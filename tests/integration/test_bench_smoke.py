"""The benchmark scripts still run end to end (on a tiny state; speed is never asserted)."""

import json
import sys

import pytest

from tests import launcher
from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration


def test_benchmark_runs_and_reports_every_method(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_checkpoint.py"),
        "--size-gb",
        "0.03",  # the smallest state whose async peak is clear of fixed overheads (1.3x)
        "--runs",
        "1",
        "--dir",
        str(tmp_path / "work"),
        "--json",
        str(out),
    ]
    done = launcher.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert set(result["median_s"]) == {
        "raw write+fsync",
        "torch.save+fsync",
        "safetensors+fsync",
        "DCP save",
        "ours sync",
        "ours sync, one file per component",
        "ours sync, blake3",
        "memcpy floor",
        "ours async pause",
        "torch.load",
        "safetensors load",
        "DCP load",
        "ours load+verify",
        "ours load+verify, one file per component",
        "ours load+verify, blake3",
    }
    assert 0.9 < result["async_extra_peak_x_state"] < 2.0


# a benchmark whose train.py runs are forked by the launcher (see tests.launcher.patch):
# the same commands, without about 8 s of imports each; speed is never asserted here
LAUNCHED = (
    "import sys; sys.path[:0] = [{bench!r}, {root!r}]\n"
    "from tests import launcher\n"
    "import {module} as bench\n"
    "launcher.patch(bench)\n"
    "sys.exit(bench.main())\n"
)


def run(script: str, *args: str, tmp_path, launched: bool = False) -> dict:
    """``script`` with ``args``, its JSON result (``launched``: its own processes through
    the launcher, where a fresh interpreter is not what it measures)."""
    out = tmp_path / f"{script}.json"
    path = ROOT / "benchmarks" / script
    head = [str(path)]
    if launched:
        code = LAUNCHED.format(bench=str(path.parent), root=str(ROOT), module=path.stem)
        head = ["-c", code]
    cmd = [sys.executable, *head, *args, "--json", str(out)]
    done = launcher.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(out.read_text())


def test_the_scaling_table_reports_seconds_per_gib_at_each_size(tmp_path):
    table = run("bench_checkpoint.py", "--scaling", "0.005,0.01", "--runs", "1", tmp_path=tmp_path)
    assert set(table["scaling"]) == {"0.005", "0.01"}
    for row in table["scaling"].values():
        assert row["ours sync s/GiB"] > 0 and row["load ratio"] > 0


def test_time_to_first_resumed_step_is_measured_against_both_baselines(tmp_path):
    result = run("bench_first_step.py", "--size-gb", "0.005", "--runs", "1", tmp_path=tmp_path)
    assert set(result["median_s"]) == {"ours", "baseline", "by-hand"}
    assert all(v > 0 for v in result["median_s"].values())


def test_differential_checkpoints_are_measured_against_full_ones_and_bit_identical(tmp_path):
    result = run(
        "bench_differential.py",
        *("--users", "2000", "--items", "1000", "--interactions", "5000"),
        *("--steps", "40", "--intervals", "10", "--runs", "1", "--min-mb", "0.1"),
        *("--dir", str(tmp_path / "work")),
        tmp_path=tmp_path,
        launched=True,
    )
    assert set(result) >= {"config", "intervals", "identity", "identical", "resume", "delta_cost"}
    assert result["identical"] is True
    row = result["intervals"]["10"]
    assert row["full"]["checkpoints"] == row["differential"]["checkpoints"] == 4
    assert row["full"]["bytes_total"] > 0 and row["differential"]["bytes_total"] > 0
    assert row["differential"]["deltas"] == 3 and row["ratio"] > 0
    assert set(result["resume"]["first_step_s_median"]) == {"full", "delta"}
    assert result["delta_cost"]["changed_rows"] > 0


def test_the_resume_self_check_cost_is_measured(tmp_path):
    result = run("bench_resume_check.py", "--steps", "500,1000", "--runs", "1", tmp_path=tmp_path)
    assert [r["steps"] for r in result["journal"]] == [500, 1000]
    assert all(0 < r["keep_s"] < r["read_s"] for r in result["journal"])
    assert result["write_checked_us"] > 0 and result["write_us"] > 0


def test_the_fingerprint_cost_is_measured_against_a_step(tmp_path):
    result = run("bench_fingerprint.py", "--size-gb", "0.125", "--runs", "1", tmp_path=tmp_path)
    assert [r["model"] for r in result][:2] == ["embedding recipe", "classifier recipe"]
    assert all(r["fingerprint_s"] > 0 and r["step_s"] > 0 for r in result)
    assert all(r["auto_every"] is None or r["auto_every"] >= 1 for r in result)


def test_the_gpu_benchmark_says_it_skipped_without_cuda_and_runs_its_steps_on_a_cpu(tmp_path):
    skipped = run("bench_gpu.py", tmp_path=tmp_path)
    if "skipped" in skipped:  # this machine: no CUDA
        assert skipped["skipped"].startswith("no CUDA device here")
    smoke = run("bench_gpu.py", "--device", "cpu", "--size-gb", "0.02", "--runs", "1",
                tmp_path=tmp_path)  # fmt: skip
    methods = smoke["methods"]
    ours = {"ours sync", "ours async pause", "ours async total", "ours restore to device"}
    theirs = {"torch.save+fsync", "torch.load to device", "parallel raw write floor"}
    assert ours | theirs <= set(methods)
    assert all(row["median_s"] > 0 for row in methods.values())
