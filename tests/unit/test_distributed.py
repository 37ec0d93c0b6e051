"""The distributed pieces: config, collectives (real gloo), per-rank files, DCP, adopted files."""

from __future__ import annotations

import hashlib
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from recovery.config import DistConfig
from recovery.errors import (
    ConfigError,
    DigestMismatchError,
    FormatError,
    IncompatibleStateError,
)
from recovery.format import tensorfile
from recovery.format.manifest import FileRecord
from recovery.integrity.commits import commit
from recovery.integrity.reads import reader
from recovery.parallel import multirank, sharded
from recovery.parallel import world as distributed
from recovery.parallel.collectives import Group
from recovery.parallel.world import World
from recovery.state import rng


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "zero"}, "dist.strategy: expected one of ddp, fsdp"),
        ({"backend": "mpi"}, "dist.backend"),
        ({"timeout_s": 0.0}, "dist.timeout_s"),
    ],
)
def test_dist_config_is_validated(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DistConfig(**kwargs)


def test_a_single_process_is_a_world_of_one_and_its_collectives_are_identities():
    assert distributed.current() == distributed.SINGLE and distributed.SINGLE.leader
    assert distributed.any_of(True, False) == [True, False]
    assert distributed.all_ok(False) is False
    assert distributed.broadcast_int(7) == 7
    assert distributed.broadcast_text("step-1.tmp-ab") == "step-1.tmp-ab"
    assert distributed.gather_text("a") == ["a"]
    x = torch.tensor(0.25)
    assert distributed.mean(x) is x
    calls = []
    assert distributed.leader_first(lambda: calls.append(1) or "made") == "made"
    assert calls == [1]


def test_derived_seeds_are_deterministic_and_distinct():
    seeds = {distributed.derived_seed(s, t, r) for s in (0, 1) for t in (0, 60) for r in (0, 1)}
    assert len(seeds) == 8
    assert distributed.derived_seed(0, 60, 1) == distributed.derived_seed(0, 60, 1)
    distributed.reseed(0, 60, 1)
    a = torch.rand(3)
    distributed.reseed(0, 60, 1)
    assert torch.equal(a, torch.rand(3))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _collectives(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        world = distributed.current()
        results = [
            world.rank,
            world.size,
            distributed.any_of(rank == 1, False),
            distributed.all_ok(rank == 0),
            distributed.all_ok(True),
            distributed.broadcast_int(41 if world.leader else -1),
            distributed.broadcast_text("step-00000030.tmp-0f" if world.leader else ""),
            float(distributed.mean(torch.tensor(float(rank)))),
            distributed.gather_text("é" * (rank * 3)),
        ]
        group = Group.create()  # the background thread's own group answers the same
        results += [
            group.all_ok(rank == 0),
            group.broadcast_int(41 if world.leader else -1),
            group.broadcast_text("step-00000030.tmp-0f" if world.leader else ""),
            group.gather_text("é" * (rank * 3)),
        ]
        with open(f"{out}.{rank}", "w") as fh:
            fh.write(repr(results))
    finally:
        torch.distributed.destroy_process_group()


def test_collectives_agree_across_two_real_gloo_ranks(tmp_path):
    out = str(tmp_path / "result")
    # forked: the ranks need not import torch again (this process holds no process group)
    mp.start_processes(_collectives, args=(_free_port(), out), nprocs=2, start_method="fork")
    for rank in (0, 1):
        with open(f"{out}.{rank}") as fh:
            got = eval(fh.read())  # our own repr of plain values
        assert got == [
            rank,
            2,
            [True, False],
            False,
            True,
            41,
            "step-00000030.tmp-0f",
            0.5,
            ["", "ééé"],
            False,
            41,
            "step-00000030.tmp-0f",
            ["", "ééé"],
        ]


def test_rank_files_round_trip_and_a_missing_rank_is_named(tmp_path):
    tree = {"rng": rng.capture()}
    records = sharded.write_rank(tmp_path, 1, tree)
    assert [r.name for r in records] == ["ranks/rank-00001.safetensors", "ranks/rank-00001.json"]
    assert (
        records[1].digest == hashlib.sha256((tmp_path / records[1].name).read_bytes()).hexdigest()
    )
    files = {
        "ranks/rank-00001.json": (tmp_path / "ranks/rank-00001.json").read_bytes(),
        "ranks/rank-00001.safetensors": torch.frombuffer(
            bytearray((tmp_path / "ranks/rank-00001.safetensors").read_bytes()), dtype=torch.uint8
        ),
    }
    back = sharded.read_rank(files, 1, where=tmp_path)
    assert torch.equal(back["rng"]["torch"], tree["rng"]["torch"])
    assert back["rng"]["python"] == tree["rng"]["python"]
    with pytest.raises(FormatError, match="no state for rank 0"):
        sharded.read_rank(files, 0, where=tmp_path)


def test_commit_adopts_files_other_processes_wrote_and_verification_covers_them(
    tmp_path, signer, trust
):
    final = tmp_path / "step-00000005"
    tmp = final.with_name(final.name + ".tmp-abc123")
    (tmp / "dcp").mkdir(parents=True)
    shard = tmp / "dcp" / "__0_0.distcp"
    shard.write_bytes(b"shard zero")  # hashed by its writer, sent as a record
    (tmp / "dcp" / ".metadata").write_bytes(b"not read by us")
    mf = commit.commit(
        final,
        {"state.json": b"{}"},
        {"step": 5},
        signer=signer,
        tmp=tmp,
        adopt=["dcp/.metadata", FileRecord("dcp/__0_0.distcp", *tensorfile.hash_file(shard))],
    )
    assert not tmp.exists()
    assert {r.name for r in mf.files} == {"dcp/.metadata", "dcp/__0_0.distcp", "state.json"}
    verified = reader.read_verified(final, trust)
    # DCP files are kept as the verified bytes: DCP reads those, never the disk
    assert verified.files["dcp/__0_0.distcp"] == (final / "dcp" / "__0_0.distcp").read_bytes()
    assert set(verified.files) == {r.name for r in mf.files}
    (final / "dcp" / "__0_0.distcp").write_bytes(b"shard Zero")
    with pytest.raises(DigestMismatchError, match="__0_0.distcp"):
        reader.read_verified(final, trust)


class Net(torch.nn.Module):
    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.a = torch.nn.Linear(3, width)
        self.b = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.b(self.a(x))
        return out


def _trained(seed: int, width: int = 4) -> tuple[Net, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    net = Net(width)
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        net(torch.randn(5, 3)).pow(2).mean().backward()
        opt.step()
    return net, opt


def test_dcp_save_and_load_in_one_process_and_a_refused_load_changes_nothing(tmp_path):
    net, opt = _trained(0)
    saved = sharded.save(net, opt, tmp_path / "dcp")
    assert (tmp_path / "dcp" / ".metadata").exists()
    assert [g["lr"] for g in saved["param_groups"]] == [0.1]

    files = {f"dcp/{f.name}": f.read_bytes() for f in (tmp_path / "dcp").iterdir()}
    other, other_opt = _trained(1)
    sharded.load(other, other_opt, files, saved, where=tmp_path)
    for key, value in net.state_dict().items():
        assert torch.equal(other.state_dict()[key], value)
    moments = [s["exp_avg"] for s in opt.state_dict()["state"].values()]
    loaded = [s["exp_avg"] for s in other_opt.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(moments, loaded, strict=True))

    wide, wide_opt = _trained(2, width=6)
    before = {k: v.clone() for k, v in wide.state_dict().items()}
    with pytest.raises(IncompatibleStateError, match=r"Size mismatch .*\[4, 3\].*\[6, 3\]"):
        sharded.load(wide, wide_opt, files, saved, where=tmp_path)
    for key, value in wide.state_dict().items():
        assert torch.equal(value, before[key]), f"{key} was half-loaded"
    with pytest.raises(IncompatibleStateError, match="param groups"):
        sharded.load(other, other_opt, files, {"param_groups": []}, where=tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"warm_start_every": 5}, "warm_start_every"),
        ({"warm_start_every": 0, "hash_type": "blake3"}, "checkpoint.hash=blake3"),
    ],
)
def test_options_the_distributed_protocol_lacks_are_refused_by_name(kwargs, message):
    two = World(rank=0, size=2, distributed=True)
    multirank.check_supported(distributed.SINGLE, async_save=True, warm_start_every=5)
    multirank.check_supported(two, async_save=True, warm_start_every=0)  # async: supported
    with pytest.raises(ConfigError, match=message):
        multirank.check_supported(two, async_save=False, **kwargs)
