"""Peer replicas of the local tier under torchrun: the placement and restore policies
(table tests), and snapshot directories sent between two real gloo ranks."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from recovery import faults
from recovery.config import CheckpointConfig, LocalConfig, ResumeCheckConfig
from recovery.errors import CommitError, ConfigError, FormatError, StorageError
from recovery.format.layout import parse_step, scan, step_dir_name
from recovery.integrity.reads import listed
from recovery.parallel import replicas, transfer
from recovery.parallel.world import World
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal
from recovery.run.tiers import collective, peers, rules
from recovery.tools import audit
from tests.conftest import tiny_state, train_steps
from tests.unit.test_distributed import _free_port


@pytest.mark.parametrize(
    ("replicas_", "space", "world", "offsets"),
    [
        (1, 1, 2, [1]),
        (1, 4, 8, [4]),  # 4 ranks a node: the same local rank of the next node
        (3, 2, 8, [2, 4, 6]),
        (0, 1, 2, []),
        (1, 3, 4, [3]),
    ],
)
def test_copies_go_to_distinct_other_ranks(replicas_, space, world, offsets):
    assert replicas.offsets(replicas_, space, world) == offsets


@pytest.mark.parametrize(
    ("replicas_", "space", "world", "most"),
    [(1, 2, 2, 0), (2, 1, 2, 1), (2, 4, 8, 1), (4, 2, 8, 3)],
)
def test_copies_on_their_own_rank_or_doubled_are_refused_with_what_fits(
    replicas_, space, world, most
):
    with pytest.raises(ConfigError, match=f"checkpoint.local.replicas at most {most} "):
        replicas.offsets(replicas_, space, world)


def test_destinations_and_sources_are_inverse():
    offs = replicas.offsets(2, 2, 6)
    for rank in range(6):
        for k, dst in enumerate(replicas.destinations(rank, 6, offs)):
            assert replicas.sources(dst, 6, offs)[k] == rank
    assert (
        replicas.spacing(0, 4) == 4 and replicas.spacing(3, 4) == 3 and replicas.spacing(0, 0) == 1
    )


@pytest.mark.parametrize(
    ("name", "owner"),
    [("rank0", (0, False)), ("replica-rank12", (12, True)), ("rank", None), ("step-1", None)],
)
def test_a_directory_name_says_whose_snapshots_it_holds(name, owner):
    assert replicas.owner_of(name) == owner


@pytest.mark.parametrize(
    ("listings", "world", "step", "holders"),
    [
        # each node its own rank's snapshots and a copy of the other's
        ([{0: [30, 33], 1: [33]}, {1: [30, 33], 0: [33]}], 2, 33, {0: 0, 1: 1}),
        # node of rank 1 lost: rank 0 holds both, rank 1 receives its own
        ([{0: [33], 1: [33]}, {}], 2, 33, {0: 0, 1: 0}),
        # the newest step is not whole (rank 1's 36 lost with its copy): the one before
        ([{0: [33, 36], 1: [33]}, {1: [33]}], 2, 33, {0: 0, 1: 1}),
        # ranks moved nodes: rank 1 sees rank 0's snapshot, rank 0 sees rank 1's
        ([{1: [9]}, {0: [9]}], 2, 9, {0: 1, 1: 0}),
        # two ranks on one node see the same files: the owner first, else the lowest
        (
            [{0: [6], 1: [6], 2: [6]}, {0: [6], 1: [6], 2: [6]}, {}, {3: [6]}],
            4,
            6,
            {0: 0, 1: 1, 2: 0, 3: 3},
        ),
    ],
)
def test_the_newest_step_every_rank_can_restore_and_who_gives_it(listings, world, step, holders):
    plan = replicas.newest_complete(listings, world)
    assert plan is not None and (plan.step, plan.holders) == (step, holders)
    assert plan.transfers() == sorted((o, h) for o, h in holders.items() if o != h)


@pytest.mark.parametrize(
    "listings",
    [
        [{0: [33]}, {}],  # rank 1's snapshot nowhere
        [{}, {}],
        [{0: [2, 4, 6]}, {1: [1, 3, 5]}],  # never the same step
        [{0: [6], 2: [6]}, {0: [6]}],  # a third rank's snapshot does not make a step whole
    ],
)
def test_no_step_is_whole(listings):
    assert replicas.newest_complete(listings, 2) is None


def test_replica_keys_are_validated():
    with pytest.raises(ConfigError, match="checkpoint.local.replicas: must be >= 0"):
        LocalConfig(every_steps=2, replicas=-1)
    with pytest.raises(ConfigError, match="checkpoint.local.replica_spacing: must be >= 0"):
        LocalConfig(every_steps=2, replica_spacing=-2)


@pytest.mark.parametrize("name", ["/etc/passwd", "../x", "a/../../x", "", "a//b"])
def test_a_peers_file_name_outside_the_snapshot_is_refused(name):
    with pytest.raises(CommitError, match="rank 3 sent a snapshot file named"):
        transfer.check_names([(name, 1)], 3)


def test_a_peers_list_given_twice_or_too_long_is_refused():
    with pytest.raises(CommitError, match="rank 3 sent a snapshot file named 'a'"):
        transfer.check_names([("a", 1), ("a", 2)], 3)
    with pytest.raises(CommitError, match="rank 3 sent 65534 files"):
        transfer.check_names([(f"f{i}", 1) for i in range(65534)], 3)
    transfer.check_names([(f"f{i}", 1) for i in range(3)], 3)


def _ring(rank: int, port: int, root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mine = Path(root) / f"rank{rank}" / "step-00000003"
        peer = 1 - rank
        got = transfer.exchange(
            [(mine, peer)],
            [(peer, Path(root) / f"replica-rank{peer}" / "step-00000003")],
            group=None,
        )
        assert got == [Path(root) / f"replica-rank{peer}" / "step-00000003"]
    finally:
        torch.distributed.destroy_process_group()


def _ring3(rank: int, port: int, root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=3)
    try:
        offs = replicas.offsets(2, 1, 3)  # every rank sends to both others, tags k = 0, 1
        send = [(Path(root) / f"rank{rank}", d) for d in replicas.destinations(rank, 3, offs)]
        into = [(s, Path(root) / f"at{rank}" / f"from{s}") for s in replicas.sources(rank, 3, offs)]
        transfer.exchange(send, into, group=None)
    finally:
        torch.distributed.destroy_process_group()


def test_three_ranks_each_send_two_copies_and_every_copy_lands_whole(tmp_path):
    for rank in range(3):
        (tmp_path / f"rank{rank}").mkdir()
        for i in range(3):  # files of different sizes: a tag mix-up would show
            (tmp_path / f"rank{rank}" / f"f{i}").write_bytes(os.urandom(1000 * (rank + 1) + i))
    mp.start_processes(_ring3, args=(_free_port(), str(tmp_path)), nprocs=3, start_method="fork")
    for rank in range(3):
        for source in (r for r in range(3) if r != rank):
            got, sent = tmp_path / f"at{rank}" / f"from{source}", tmp_path / f"rank{source}"
            assert transfer.listing(got) == transfer.listing(sent)
            for i in range(3):
                assert (got / f"f{i}").read_bytes() == (sent / f"f{i}").read_bytes()


def test_two_ranks_send_each_other_their_snapshot_at_once(tmp_path):
    for rank in (0, 1):
        snap = tmp_path / f"rank{rank}" / "step-00000003"
        (snap / "sub").mkdir(parents=True)
        (snap / "model.safetensors").write_bytes(os.urandom(300_000 + rank))
        (snap / "sub" / "empty").write_bytes(b"")
        (snap / "model.sig").write_text(f"signed by {rank}")
        (tmp_path / f"replica-rank{rank}" / "step-00000003").mkdir(parents=True)  # replaced
    mp.start_processes(_ring, args=(_free_port(), str(tmp_path)), nprocs=2, start_method="fork")
    for rank in (0, 1):
        sent, copy = tmp_path / f"rank{rank}" / "step-00000003", tmp_path / f"replica-rank{rank}"
        assert transfer.listing(copy / "step-00000003") == transfer.listing(sent)
        for name, _ in transfer.listing(sent):
            assert (copy / "step-00000003" / name).read_bytes() == (sent / name).read_bytes()
        assert [p.name for p in copy.iterdir()] == ["step-00000003"]  # no temp left


def _step(state, draws: list) -> float:
    """A training step (dropout off: the parameters stay replicated across ranks, as DDP
    keeps them), then a draw from this rank's torch RNG stream, which differs per rank;
    the step's loss."""
    [loss] = train_steps(state, 1)
    draws.append(int(torch.randint(0, 2**31, (1,))))
    return loss


def _trained(rank: int, steps: int) -> list:
    """Rank ``rank``'s parameters and RNG draws over ``steps`` uninterrupted steps."""
    state, draws = tiny_state(), []
    state.components["model"].eval()
    torch.manual_seed(100 + rank)
    for _ in range(steps):
        _step(state, draws)
    return [[t.tolist() for t in state.components["model"].parameters()], draws]


def _fsdp_state():
    """A two-layer model sharded with FSDP2 (as recipes/common.py shards), its optimizer."""
    from torch.distributed.fsdp import fully_shard

    from recovery.state.registry import TrainState
    from recovery.state.sampler import ResumableSampler

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    fully_shard(model[0])
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
    return TrainState(
        model=model, optimizer=opt, scheduler=sched, sampler=ResumableSampler(32, 8, seed=0)
    )


def _tiered_rank(
    rank: int,
    port: int,
    tmp: str,
    steps: int,
    out: str,
    keys: tuple,
    async_save: bool,
    strategy: str = "ddp",
    local_every: int = 2,
    settle: bool = True,
) -> None:
    """One rank of a two-rank job with a local tier (each rank its own node-local root,
    copies on the other rank): restore ``latest``, train to ``steps``, close; the step it
    started from and its parameters go to ``out.<rank>``. ``settle``: after a persistent
    step, wait for its snapshot and promotion (the next snapshot is then never skipped)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    try:
        state = tiny_state() if strategy == "ddp" else _fsdp_state()
        local = LocalConfig(every_steps=local_every, root=str(Path(tmp) / f"shm{rank}"))
        cfg = CheckpointConfig(
            root=tmp,
            every_steps=6,
            keep_last=2,
            local=local,
            async_save=async_save,
            resume_check=ResumeCheckConfig(strict=True),  # the redone step 9, exactly
        )
        ck = Checkpointer(
            cfg,
            Path(tmp) / "run",
            final_step=12,
            journal=Journal(Path(tmp) / "run" / "metrics.jsonl" if rank == 0 else None),
            signer=keys[0],
            trust=keys[1],
            provenance={"seed": 0},
            config={"seed": 0},
            world=World(rank=rank, size=2, distributed=True),
            strategy=strategy,
        )
        state.components["model"].eval()
        start, draws = ck.restore(state, "latest"), []
        if start == 0:
            torch.manual_seed(100 + rank)
        for step in range(start + 1, steps + 1):
            ck.record(step, loss=_step(state, draws))
            ck.maybe_save(state, step)
            if settle and step % 6 == 0:  # the next snapshot is not skipped as busy
                ck.flush()
        ck.close()
        full = [
            getattr(t, "full_tensor", t.detach)() for t in state.components["model"].parameters()
        ]
        Path(f"{out}.{rank}").write_text(repr([start, [t.tolist() for t in full], draws]))
    finally:
        torch.distributed.destroy_process_group()


def _run_tiered(
    tmp: Path,
    steps: int,
    keys: tuple,
    async_save: bool,
    strategy: str = "ddp",
    local_every: int = 2,
    settle: bool = True,
) -> list:
    out = str(tmp / f"out-{steps}")
    args = (_free_port(), str(tmp), steps, out, keys, async_save, strategy, local_every, settle)
    mp.start_processes(_tiered_rank, args=args, nprocs=2, start_method="fork")
    return [eval(Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]  # our own repr


@pytest.mark.parametrize(
    ("damaged", "async_save", "unpromotable"),
    [(False, True, False), (True, False, False), (False, False, True)],
    ids=["copy-async", "damaged-copy", "not-promoted"],
)
def test_a_rank_whose_node_lost_its_ram_resumes_from_its_peers_copy(
    tmp_path, signer, trust, damaged, async_save, unpromotable, monkeypatch
):
    """Two ranks (forked, gloo), each its own local root: snapshots every 2 steps, sent to
    the other rank; persistent every 6. Stopped after step 9 (snapshot 8, persistent 6),
    rank 1's root wiped: both resume from step 8, rank 1's snapshot sent back from rank
    0's copy, and end where an uninterrupted run ends, each rank with its own RNG. The
    copy damaged (a flipped byte): rank 1's verification refuses it, and both ranks pass
    step 8 over to persistent 6. A directory of a layout no rank uses now (``rank5``) goes
    at the start; once the last step is persistent, nothing is left in either root. A
    resumed step whose snapshot cannot be read back for its promotion (``unpromotable``) is
    a warning, not a stop: the job goes on from the state it recovered."""
    _run_tiered(tmp_path, 9, (signer, trust), async_save)
    [run] = (tmp_path / "shm0").iterdir()
    assert sorted(p.name for p in run.iterdir()) == ["rank0", "replica-rank1"]
    assert [p.name for p in (run / "replica-rank1").iterdir()] == ["step-00000008"]
    assert [p.name for p in (run / "rank0").iterdir()] == ["step-00000008"]
    # one rank's state alone: a process outside torchrun passes it over
    assert peers.single([(8, run / "rank0" / "step-00000008")], trust, False) == []
    shutil.rmtree(tmp_path / "shm1")
    if damaged:
        victim = run / "replica-rank1" / "step-00000008" / "model.safetensors"
        raw = bytearray(victim.read_bytes())
        raw[-1] ^= 1
        victim.write_bytes(bytes(raw))
    shutil.copytree(run / "rank0", run / "rank5")  # an earlier layout's, or another branch
    if unpromotable:  # the forked ranks inherit it
        read = collective.RankPromotion._read

        def refused(self, path, mf, like, resumed):
            if resumed is not None:
                raise FormatError(f"{path}: written by another layout (this test)")
            return read(self, path, mf, like, resumed)

        monkeypatch.setattr(collective.RankPromotion, "_read", refused)
    got = _run_tiered(tmp_path, 12, (signer, trust), async_save)
    start = 6 if damaged else 8
    assert [s for s, _, _ in got] == [start, start]
    for rank, (_, params, draws) in enumerate(got):  # each rank its own stream, exactly
        want_params, want_draws = _trained(rank, 12)
        assert params == want_params and draws == want_draws[start:], rank
    assert got[0][2] != got[1][2]
    assert [list((tmp_path / f"shm{r}").iterdir()) for r in (0, 1)] == [[], []]
    # the step resumed from the ranks' snapshots is made persistent at once (promoted)
    journal = (tmp_path / "run" / "metrics.jsonl").read_text()
    saves = [json.loads(line) for line in journal.splitlines() if '"checkpoint"' in line]
    assert [(r["step"], r["mode"]) for r in saves] == [
        (6, "promoted"), *([] if damaged or unpromotable else [(8, "promoted")]), (12, "promoted")
    ]  # fmt: skip
    if not (damaged or unpromotable):
        resumed = listed.read_manifest(tmp_path / "run" / "step-00000008", trust).recovery
        assert resumed["promoted"] is True and not {"tier", "rank"} & resumed.keys()
        # the lineage records the snapshot resumed from (in RAM, gone): the audit finds the
        # checkpoint promoted from it, by the digest its statement names (6: retention's)
        report = audit.audit(tmp_path / "run" / "step-00000012", trust)
        assert [(link.relation, link.step, link.status) for link in report.links] == [
            ("self", 12, audit.OK), ("resume", 8, audit.OK), ("previous", 6, audit.PRUNED)
        ]  # fmt: skip
        back = report.links[1]
        assert back.tier == "local" and report.ok
        assert back.promoted_from == resumed["promoted_from"]["sha256"] != back.sha256


def test_a_snapshot_being_promoted_stays_while_newer_rounds_retire_older_ones(
    tmp_path, signer, trust, monkeypatch
):
    """A snapshot every step, persistent every 6: step 6's promotion reads its snapshot back
    only once snapshot 8 has reached the peer and retired 7. Step 6 is held by the
    promotion as well as by its copy to the peer, and the copy's release must not free it:
    the promotion reads it whole and the job ends where the uninterrupted job ends."""
    read = collective.reader.read_verified

    def late(path, *args, **kwargs):  # the forked ranks inherit it
        step = parse_step(path.name)
        deadline = time.monotonic() + (20 if step == 6 else 0)  # 12: the last step
        while time.monotonic() < deadline and not (
            (path.parent / step_dir_name(step + 2)).exists()
            and not (path.parent / step_dir_name(step + 1)).exists()
        ):
            time.sleep(0.01)
        return read(path, *args, **kwargs)

    monkeypatch.setattr(collective.reader, "read_verified", late)
    got = _run_tiered(tmp_path, 12, (signer, trust), False, local_every=1, settle=False)
    for rank, (start, params, draws) in enumerate(got):
        want_params, want_draws = _trained(rank, 12)
        assert (start, params, draws) == (0, want_params, want_draws), rank
    journal = (tmp_path / "run" / "metrics.jsonl").read_text()
    saves = [json.loads(line) for line in journal.splitlines() if '"checkpoint"' in line]
    assert [(r["step"], r["mode"]) for r in saves] == [(6, "promoted"), (12, "promoted")]


@pytest.mark.parametrize(
    ("rank", "point"),
    [(1, "rank-1-write-6"), (0, "commit-before-manifest-6"), (0, "commit-before-rename-6")],
    ids=["its-own-files", "before-the-manifest", "before-the-rename"],
)
def test_a_rank_killed_in_a_phase_of_a_promotion_commits_nothing_and_the_job_resumes(
    tmp_path, signer, trust, monkeypatch, rank, point
):
    """Step 6's promotion (every rank's snapshot read back, the collective save): ``rank``
    dies at ``point`` (``os._exit``, no clean-up: a SIGKILL), the other rank's collectives
    break. Nothing is committed in the run directory; the job resumes from the ranks'
    snapshots of 6, promotes that step at once, and ends where the uninterrupted run ends."""
    reach = faults.reach

    def dies(name: str) -> None:  # the forked ranks inherit it
        if name == point and torch.distributed.get_rank() == rank:
            os._exit(9)
        reach(name)

    monkeypatch.setattr(faults, "reach", dies)
    with pytest.raises(mp.ProcessExitedException):
        _run_tiered(tmp_path, 9, (signer, trust), False)
    listing = scan(tmp_path / "run")
    assert listing.committed == [] and listing.stale, point  # its temp directory, unsigned
    monkeypatch.setattr(faults, "reach", reach)
    got = _run_tiered(tmp_path, 12, (signer, trust), False)
    assert [s for s, _, _ in got] == [6, 6]
    for r, (_, params, draws) in enumerate(got):
        want_params, want_draws = _trained(r, 12)
        assert params == want_params and draws == want_draws[6:], r
    journal = (tmp_path / "run" / "metrics.jsonl").read_text()
    saves = [json.loads(line) for line in journal.splitlines() if '"checkpoint"' in line]
    assert [(r["step"], r["mode"]) for r in saves] == [(6, "promoted"), (12, "promoted")]
    assert not scan(tmp_path / "run").stale


def _refusing_rank(rank: int, out: str, *args) -> None:
    """:func:`_tiered_rank`, whose error (type and message) goes to ``out.<rank>``."""
    try:
        _tiered_rank(rank, *args)
    except Exception as err:
        Path(f"{out}.{rank}").write_text(f"{type(err).__name__}: {err}")


@pytest.mark.parametrize(("check", "steps"), [(1, 0), (2, 4)], ids=["at-start", "recheck"])
def test_a_node_whose_ram_does_not_fit_stops_every_rank_at_once_with_one_line(
    tmp_path, signer, trust, monkeypatch, check, steps
):
    """Rank 1's node has no room for the local tier (its RAM check refuses, at start or when
    the first snapshot's real size is checked again before the second, step 4): rank 1 says
    so in one line, and rank 0, whose node has room, refuses too at the same point, naming
    the other node, rather than waiting in a collective for a rank that is gone."""
    fit, calls = rules.fit, []
    refusal = "checkpoint.local.root: the local tier in (this test) needs more than there is"

    def full(*args, **kwargs):  # the forked ranks inherit it
        calls.append(1)
        if torch.distributed.get_rank() == 1 and len(calls) == check:
            raise StorageError(refusal)
        return fit(*args, **kwargs)

    monkeypatch.setattr(rules, "fit", full)
    out = str(tmp_path / "err")
    args = (out, _free_port(), str(tmp_path), 9, str(tmp_path / "out"), (signer, trust), False)
    mp.start_processes(_refusing_rank, args=args, nprocs=2, start_method="fork")
    said = [Path(f"{out}.{rank}").read_text() for rank in (0, 1)]
    assert said[1] == f"StorageError: {refusal}"
    assert said[0].startswith("StorageError: checkpoint.local.root: another node's local tier")
    journal = (tmp_path / "run" / "metrics.jsonl").read_text()
    trained = [json.loads(line) for line in journal.splitlines() if '"loss"' in line]
    assert [r["step"] for r in trained] == list(range(1, steps + 1))


def test_fsdp_shards_of_a_node_that_lost_its_ram_come_back_from_its_peer(tmp_path, signer, trust):
    """FSDP2 (each rank holds half of every parameter and of Adam's moments): a rank's
    snapshot holds its own shards; rank 1's root wiped after step 9, both ranks resume from
    step 8, rank 1's shards sent back from rank 0's copy, and the job ends where the
    uninterrupted FSDP2 job ends, each rank's RNG stream exact."""
    # imported once here, not in every forked rank
    import torch.distributed.checkpoint.state_dict
    import torch.distributed.fsdp  # noqa: F401

    keys = (signer, trust)
    # the reference without the tier: taking snapshots must not change the run
    reference = _run_tiered(tmp_path / "reference", 12, keys, False, "fsdp", local_every=0)
    _run_tiered(tmp_path / "job", 9, keys, False, "fsdp")
    shutil.copytree(tmp_path / "job", tmp_path / "every-node-lost")
    shutil.rmtree(tmp_path / "job" / "shm1")
    got = _run_tiered(tmp_path / "job", 12, keys, False, "fsdp")
    assert [s for s, _, _ in got] == [8, 8]
    for rank in (0, 1):
        assert got[rank][1] == reference[rank][1]
        assert got[rank][2] == reference[rank][2][8:]
    # every node's RAM lost: step 6, promoted from both ranks' snapshots into one sharded
    # checkpoint (the training thread paused for the snapshots alone), resumes exactly
    lost = tmp_path / "every-node-lost"
    for rank in (0, 1):
        shutil.rmtree(lost / f"shm{rank}")
    journal = (lost / "run" / "metrics.jsonl").read_text()
    records = [json.loads(line) for line in journal.splitlines()]
    assert [(r["step"], r["mode"]) for r in records if r.get("event") == "checkpoint"] == [
        (6, "promoted")
    ]
    promoted = listed.read_manifest(lost / "run" / "step-00000006", trust)
    assert promoted.recovery["promoted"] is True and "tier" not in promoted.recovery
    got = _run_tiered(lost, 12, keys, False, "fsdp")
    assert [s for s, _, _ in got] == [6, 6]
    for rank in (0, 1):
        assert got[rank][1] == reference[rank][1]
        assert got[rank][2] == reference[rank][2][6:]
