"""The benchmark script still runs end to end (on a tiny state; speed is never asserted)."""

import json
import subprocess
import sys

import pytest

from tests.integration.conftest import ROOT

pytestmark = pytest.mark.integration


def test_benchmark_runs_and_reports_every_method(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_checkpoint.py"),
        "--size-gb",
        "0.01",
        "--runs",
        "1",
        "--dir",
        str(tmp_path / "work"),
        "--json",
        str(out),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert set(result["median_s"]) == {
        "raw write+fsync",
        "torch.save+fsync",
        "safetensors+fsync",
        "DCP save",
        "ours sync",
        "memcpy floor",
        "ours async pause",
        "torch.load",
        "safetensors load",
        "DCP load",
        "ours load+verify",
    }
    assert 0.9 < result["async_extra_peak_x_state"] < 2.0
