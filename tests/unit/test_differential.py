"""Differential checkpoints through the API: a base and its deltas, verified as one chain."""

import shutil

import pytest
import torch
from torch import nn

from recovery.config import CheckpointConfig, DifferentialConfig
from recovery.errors import BrokenChainError
from recovery.format.layout import BEST_DIR, scan, step_dir_name
from recovery.integrity.keys.signing import Signer, generate_keypair
from recovery.integrity.reads import chain
from recovery.run.checkpointer import Checkpointer
from recovery.run.journal import Journal, read
from recovery.run.restoring import checked, choose
from recovery.run.saving import retention
from recovery.state.registry import TrainState
from recovery.state.sampler import ResumableSampler
from recovery.tools.drill import flat_tensors

ROWS = 400


class Tiny(nn.Module):
    """A table with sparse gradients and a dense head."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(ROWS, 8, sparse=True)
        self.head = nn.Linear(8, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.table(ids)).squeeze(-1)
        return out


def sparse_state() -> TrainState:
    torch.manual_seed(0)
    model = Tiny()
    dense = torch.optim.Adam(model.head.parameters(), lr=0.01)
    tables = torch.optim.SparseAdam(list(model.table.parameters()), lr=0.01)
    return TrainState(
        model=model,
        optimizer=dense,
        sparse_optimizer=tables,
        scheduler=torch.optim.lr_scheduler.LambdaLR(dense, lambda s: 1.0 / (1 + s)),
        sampler=ResumableSampler(4000, 16, seed=0),
    )


def train_step(state: TrainState) -> float:
    model = state.components["model"]
    _, ids = state.components["sampler"].next_batch()
    rows = torch.from_numpy(ids) % ROWS
    loss = (model(rows) - 1.0).pow(2).mean()
    for name in ("optimizer", "sparse_optimizer"):
        state.components[name].zero_grad()
    loss.backward()
    for name in ("optimizer", "sparse_optimizer"):
        state.components[name].step()
    state.components["scheduler"].step()
    return loss.item()


def run(root, steps, signer, trust, prov, *, resume_spec=None, keep_last=10, **differential):
    """Train to ``steps``, saving every 2; differential saves when ``differential`` is given."""
    state = sparse_state()
    cfg = CheckpointConfig(
        root=str(root),
        every_steps=2,
        keep_last=keep_last,
        differential=DifferentialConfig(**differential),
    )
    return _train(cfg, root, steps, signer, trust, prov, state, resume_spec)


def _train(cfg, root, steps, signer, trust, prov, state, resume_spec=None, score=None):
    journal = Journal(root / "run" / "metrics.jsonl")
    ck = Checkpointer(
        cfg,
        root / "run",
        final_step=steps,
        journal=journal,
        signer=signer,
        trust=trust,
        provenance=prov,
        config={"seed": 0},
    )
    step = ck.restore(state, resume_spec)
    while step < steps:
        loss = train_step(state)
        step += 1
        ck.maybe_save(state, step, metrics={"loss": loss, "score": (score or {}).get(step, 0)})
    ck.close()
    journal.close()
    return root / "run"


def assert_same(a, b):
    """Two decoded trees equal: every tensor bit for bit, every other leaf by value."""
    assert a.keys() == b.keys()
    for name in a:
        fa, fb = flat_tensors(a[name]), flat_tensors(b[name])
        assert fa.keys() == fb.keys(), name
        for key in fa:
            assert fa[key].dtype == fb[key].dtype and torch.equal(fa[key], fb[key]), (name, key)
    assert a["sampler"] == b["sampler"] and a["scheduler"] == b["scheduler"]


ON = {"enabled": True, "full_every": 3, "min_mb": 0, "against": "full"}
"""One-link deltas: each against its chain's full checkpoint."""
CHAINED = {**ON, "against": "previous"}
"""Each delta against the save before it."""


def differential_config(root, differential=ON, **settings):
    """Saves every 2 steps, each third full; ``settings``: the other keys."""
    settings.setdefault("keep_last", 10)
    return CheckpointConfig(
        root=str(root), every_steps=2, differential=DifferentialConfig(**differential), **settings
    )


@pytest.fixture
def chain_run(tmp_path, signer, trust, prov):
    """A differential run to 12 (bases 2 and 8, deltas 4, 6, 10, 12) and a full one."""
    diff = run(tmp_path / "diff", 12, signer, trust, prov, **ON)
    full = run(tmp_path / "full", 12, signer, trust, prov)
    return diff, full


def test_base_plus_delta_restores_exactly_what_a_full_checkpoint_holds(chain_run, trust):
    diff, full = chain_run
    kinds = {}
    for step in range(2, 13, 2):
        a = choose.load(diff / step_dir_name(step), trust)
        b = choose.load(full / step_dir_name(step), trust)
        assert b.delta is None
        kinds[step] = a.delta["base"] if a.delta else "full"
        assert_same(a.decoded.tree, b.decoded.tree)
        if a.delta:  # its files hold only the changed rows of each table
            assert a.delta["bytes"] < sum(r.size for r in b.manifest.files)
            assert "model/table.weight" in a.delta["tables"]
    assert kinds == {
        2: "full",
        4: step_dir_name(2),
        6: step_dir_name(2),
        8: "full",
        10: step_dir_name(8),
        12: step_dir_name(8),
    }


@pytest.mark.parametrize(("settings", "base_of_12"), [(ON, 8), (CHAINED, 10)])
def test_a_resume_continues_the_chain_and_trains_the_same_run(
    tmp_path, signer, trust, prov, settings, base_of_12
):
    ref = run(tmp_path / "ref", 16, signer, trust, prov, **settings)
    run(tmp_path / "job", 10, signer, trust, prov, **settings)
    job = run(tmp_path / "job", 16, signer, trust, prov, resume_spec="latest", **settings)
    resumed = [r for r in read(job / "metrics.jsonl") if r.get("event") == "resume"]
    assert resumed[-1]["step"] == 10 and resumed[-1]["base"].endswith(step_dir_name(8))
    for step in (12, 14, 16):  # 12: the third of base 8's chain; 14 a new full one
        a = choose.load(ref / step_dir_name(step), trust)
        b = choose.load(job / step_dir_name(step), trust)
        assert (a.delta or {}).get("chain") == (b.delta or {}).get("chain")
        assert_same(a.decoded.tree, b.decoded.tree)
    # one-link: a delta of the chain's full checkpoint; chained: of the resumed one
    assert choose.load(job / step_dir_name(12), trust).delta["base"] == step_dir_name(base_of_12)


def test_a_delta_without_its_base_is_refused_and_latest_falls_back(chain_run, trust):
    diff, _ = chain_run
    shutil.rmtree(diff / step_dir_name(8))
    with pytest.raises(BrokenChainError, match="is a delta of step-00000008 .* which is missing"):
        choose.load(diff / step_dir_name(12), trust)
    loaded = choose.select(diff, "latest", trust)
    assert loaded.path.name == step_dir_name(6)  # the newest whose whole chain verifies
    assert [p.name for p, _ in loaded.skipped] == [step_dir_name(12), step_dir_name(10)]
    assert "which is missing" in loaded.skipped[0][1]


def test_a_delta_whose_base_is_damaged_or_replaced_is_refused(chain_run, trust):
    diff, full = chain_run
    target = diff / step_dir_name(12)
    base = diff / step_dir_name(8)
    original = base.with_name("saved")
    shutil.copytree(base, original)
    # replaced: another committed, signed checkpoint of that step (the full run's)
    shutil.rmtree(base)
    shutil.copytree(full / step_dir_name(8), base)
    with pytest.raises(BrokenChainError, match="was replaced by another checkpoint of that step"):
        choose.load(target, trust)
    # damaged: one flipped byte in the base's tensors
    shutil.rmtree(base)
    shutil.copytree(original, base)
    victim = base / "sparse_optimizer.safetensors"
    victim.chmod(0o644)
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0x01
    victim.write_bytes(bytes(data))
    with pytest.raises(BrokenChainError, match="which fails verification .*expected sha256") as err:
        choose.load(target, trust)
    assert err.value.base == base and err.value.path == victim


def test_retention_keeps_the_bases_of_kept_deltas_and_a_fallback_off_the_newest_base(
    tmp_path, signer, trust, prov
):
    run_dir = run(tmp_path / "r", 16, signer, trust, prov, keep_last=2, **ON)
    # saves: 2 base, 4, 6 | 8 base, 10, 12 | 14 base, 16. keep 14, 16 (both on base 14),
    # so the newest before 14 (12) and its base (8) are the fallback
    assert [s for s, _ in scan(run_dir).committed] == [8, 12, 14, 16]
    for _, path in scan(run_dir).committed:
        choose.load(path, trust)  # each one's chain is whole
    retired = [r["steps"] for r in read(run_dir / "metrics.jsonl") if r.get("event") == "retired"]
    assert sorted(s for steps in retired for s in steps) == [2, 4, 6, 10]


def test_async_saves_write_the_same_chain(tmp_path, signer, trust, prov):
    ref = run(tmp_path / "sync", 8, signer, trust, prov, **ON)
    state = sparse_state()
    cfg = differential_config(tmp_path / "async", async_save=True)
    got = _train(cfg, tmp_path / "async", 8, signer, trust, prov, state)
    for step in (2, 4, 6, 8):
        a = choose.load(ref / step_dir_name(step), trust)
        b = choose.load(got / step_dir_name(step), trust)
        assert (a.delta or {}).get("base") == (b.delta or {}).get("base")
        assert_same(a.decoded.tree, b.decoded.tree)


def test_the_best_copy_of_a_delta_brings_its_base(tmp_path, signer, trust, prov):
    cfg = differential_config(
        tmp_path, keep_last=2, keep_best=True, best_metric="score", best_mode="max"
    )
    # the best: 4 (a delta of 2), then 8 (a base), then 12 (a delta of 8)
    score = {4: 1, 8: 2, 12: 3}
    for steps, kept in ((4, [2, 4]), (8, [8]), (12, [8, 12])):
        run_dir = _train(cfg, tmp_path, steps, signer, trust, prov, sparse_state(), score=score)
        best = [p.name for _, p in scan(run_dir / BEST_DIR).committed]
        assert best == [step_dir_name(s) for s in kept]  # a delta's copy with its base
        chosen = choose.select(run_dir, "best", trust)
        assert chosen.path == run_dir / BEST_DIR / step_dir_name(steps)
        assert_same(
            chosen.decoded.tree, choose.load(run_dir / step_dir_name(steps), trust).decoded.tree
        )
        shutil.rmtree(run_dir.parent)


def test_a_best_copy_killed_after_bringing_its_base_leaves_the_old_best(
    tmp_path, signer, trust, prov
):
    cfg = differential_config(
        tmp_path, keep_last=10, keep_best=True, best_metric="score", best_mode="max"
    )
    run_dir = _train(cfg, tmp_path, 12, signer, trust, prov, sparse_state(), score={4: 5})
    best = run_dir / BEST_DIR
    assert [p.name for _, p in scan(best).committed] == [step_dir_name(2), step_dir_name(4)]
    # step 10 (a delta of 8) beat it: its base was brought in, then the kill, before the
    # delta's copy was in place: the base is the newest directory of best/
    shutil.copytree(run_dir / step_dir_name(8), best / step_dir_name(8))
    (best / f"{retention.INCOMING}{step_dir_name(10)}").write_text(step_dir_name(8))
    removed = retention.tidy_best(run_dir)
    assert removed == [best / step_dir_name(8)]
    assert [p.name for _, p in scan(best).committed] == [step_dir_name(2), step_dir_name(4)]
    assert choose.select(run_dir, "best", trust).path == best / step_dir_name(4)
    assert not list(best.glob(f"{retention.INCOMING}*"))


def test_a_malformed_differential_record_is_refused_by_name(chain_run, signer, trust):
    import json

    from recovery.errors import FormatError
    from tests.conftest import resign

    diff, _ = chain_run
    target = diff / step_dir_name(12)
    state_file = target / "state.json"
    doc = json.loads(state_file.read_text())
    doc["differential"]["sequence"] = "two"
    state_file.chmod(0o644)
    state_file.write_text(json.dumps(doc))
    digest = __import__("hashlib").sha256(state_file.read_bytes()).hexdigest()
    size = state_file.stat().st_size

    def edit(statement):
        for res in statement["predicate"]["resources"]:
            if res["name"] == "state.json":
                res["digest"] = digest
        statement["predicate"]["recovery"]["sizes"]["state.json"] = size

    resign(target, signer, edit)
    with pytest.raises(FormatError, match="state.json: malformed differential record"):
        choose.load(target, trust)


def test_a_delta_named_by_a_relative_path_finds_its_base(chain_run, trust, monkeypatch):
    from pathlib import Path

    diff, _ = chain_run
    monkeypatch.chdir(diff / step_dir_name(12))
    assert choose.load(Path("."), trust).delta["base"] == step_dir_name(8)


@pytest.mark.parametrize(
    ("forge", "problem"),
    [
        (lambda idx: idx.__setitem__(-1, 10**6), "rows outside 0..{n}"),
        (lambda idx: idx.__setitem__(0, -1), "rows outside 0..{n}"),
        (lambda idx: idx.__setitem__(1, idx[0]), "rows not ascending and unique"),
    ],
)
def test_verify_refuses_the_delta_rows_the_loader_refuses_without_torch(
    chain_run, tmp_path, forge, problem
):
    """Row indexes out of range, negative or duplicated, re-signed by an untrusted key:
    the torch-free check (recovery verify --allow-untrusted) refuses what resuming does,
    in the same words."""

    diff, _ = chain_run
    target = diff / step_dir_name(12)
    key = forge_rows(target, forge, tmp_path)
    loaded, verified = both_refusals(target)
    said = f"patched table {key!r}: {problem.format(n=entry_rows(diff, key))}"
    assert said in loaded and said in verified
    assert verified.endswith(loaded.split(": patched table", 1)[1])


def test_verify_refuses_bad_rows_in_a_link_below_the_delta_it_verifies(linked_run, tmp_path):
    """A middle link's row indexes forged (and the chain re-signed by an untrusted key to
    hold together): verifying the delta above it refuses what resuming it does."""
    from recovery.integrity.keys.signing import TrustStore
    from recovery.integrity.reads import reader
    from tests.conftest import resign

    linked, _, _ = linked_run
    middle, top = linked / step_dir_name(10), linked / step_dir_name(12)
    key = forge_rows(middle, lambda idx: idx.__setitem__(-1, 10**6), tmp_path)
    root = reader.read_manifest(middle, TrustStore(), allow_untrusted=True).root

    other = Signer(generate_keypair(tmp_path / "other-top")[0])

    def rebase(statement):
        statement["predicate"]["recovery"]["base"]["digest"] = root
        statement["predicate"]["recovery"]["signer"] = other.describe()

    resign(top, other, rebase)
    loaded, verified = both_refusals(top)
    said = f"patched table {key!r}: rows outside"
    assert said in loaded and said in verified


def both_refusals(path):
    """The FormatError messages of resuming ``path`` and of verifying it without torch
    (untrusted keys allowed): both must refuse."""
    from recovery.errors import FormatError
    from recovery.integrity.keys.signing import TrustStore
    from recovery.run.restoring import checked

    with pytest.raises(FormatError) as loaded:
        choose.load(path, TrustStore(), allow_untrusted=True)
    with pytest.raises(FormatError) as verified:
        checked.check(path, TrustStore(), allow_untrusted=True)
    return str(loaded.value), str(verified.value)


def forge_rows(target, forge, tmp_path):
    """Rewrite one row index of two or more rows in ``target``'s tensor files with
    ``forge`` and re-sign it with a new, untrusted key; the patched table's key."""
    import array
    import hashlib

    from recovery.format import safeheader
    from recovery.format.statedoc import ROWS
    from tests.conftest import resign

    for file in sorted(target.glob("*.safetensors")):
        data = bytearray(file.read_bytes())
        header = safeheader.parse(bytes(data), len(data), name=str(file))
        found = [e for e in header.entries if e.key.startswith(ROWS) and e.shape[0] >= 2]
        if found:
            break
    else:
        pytest.fail(f"no delta row index of two or more rows in {target.name}")
    entry = found[0]
    begin, end = header.start + entry.begin, header.start + entry.end
    idx = array.array("q", bytes(data[begin:end]))
    forge(idx)
    data[begin:end] = idx.tobytes()
    file.chmod(0o644)
    file.write_bytes(bytes(data))
    digest = hashlib.sha256(bytes(data)).hexdigest()
    other = Signer(generate_keypair(tmp_path / f"other-{target.name}")[0])

    def edit(statement):
        for res in statement["predicate"]["resources"]:
            if res["name"] == file.name:
                res["digest"] = digest
        statement["predicate"]["recovery"]["signer"] = other.describe()

    resign(target, other, edit)
    return entry.key[len(ROWS) :]


def entry_rows(diff, key):
    """The rows of table ``key`` in the chain's base (step 8)."""
    from recovery.format import safeheader

    for file in (diff / step_dir_name(8)).glob("*.safetensors"):
        data = file.read_bytes()
        for e in safeheader.parse(data, len(data), name=str(file)).entries:
            if e.key == key:
                return e.shape[0] - 1
    raise AssertionError(key)


@pytest.fixture
def linked_run(tmp_path, signer, trust, prov):
    """A chained differential run to 12 (2 full, 4 of 2, 6 of 4; 8 full, 10 of 8, 12 of 10),
    a one-link one and a full one."""
    linked = run(tmp_path / "linked", 12, signer, trust, prov, **CHAINED)
    one = run(tmp_path / "one", 12, signer, trust, prov, **ON)
    full = run(tmp_path / "full", 12, signer, trust, prov)
    return linked, one, full


def test_each_link_of_a_chain_restores_exactly_what_a_full_checkpoint_holds(linked_run, trust):
    linked, one, full = linked_run
    chains = {}
    for step in range(2, 13, 2):
        a = choose.load(linked / step_dir_name(step), trust)
        assert_same(a.decoded.tree, choose.load(full / step_dir_name(step), trust).decoded.tree)
        chains[step] = a.delta["chain"] if a.delta else []
        if a.delta:
            assert a.delta["base"] == step_dir_name(step - 2)
            assert a.delta["sequence"] == len(a.delta["chain"])
            # only the rows changed since the save before: fewer than since the full one
            b = choose.load(one / step_dir_name(step), trust)
            mine, theirs = a.delta["tables"], b.delta["tables"]
            assert all(mine[k][0] <= theirs[k][0] for k in mine)
            assert a.delta["bytes"] <= b.delta["bytes"]
    assert chains[6] == [step_dir_name(2), step_dir_name(4)]
    assert chains[12] == [step_dir_name(8), step_dir_name(10)]
    assert chains[8] == [] and chains[2] == []
    # and without torch: ls's and verify's check reads the same chain
    for step in (6, 12):
        assert checked.check(linked / step_dir_name(step), trust).delta["chain"] == chains[step]


def test_a_link_missing_from_a_chain_takes_the_links_above_it_down(linked_run, trust):
    linked, _, _ = linked_run
    shutil.rmtree(linked / step_dir_name(10))
    with pytest.raises(BrokenChainError) as err:
        choose.load(linked / step_dir_name(12), trust)
    assert "is a delta of step-00000010 (step 10), which is missing" in str(err.value)
    chosen = choose.select(linked, "latest", trust)
    assert chosen.path == linked / step_dir_name(8)  # 12 falls, 8 is whole


def test_retention_keeps_every_link_a_kept_delta_needs(tmp_path, signer, trust, prov):
    run_dir = run(tmp_path / "r", 16, signer, trust, prov, keep_last=2, **CHAINED)
    # saves: 2 full, 4, 6 | 8 full, 10, 12 | 14 full, 16. keep 14, 16 (both on 14), so
    # the newest before 14 (12) and its chain (10, 8) are the fallback
    assert [s for s, _ in scan(run_dir).committed] == [8, 10, 12, 14, 16]
    for _, path in scan(run_dir).committed:
        choose.load(path, trust)  # each one's chain is whole


def test_the_best_copy_of_a_link_brings_its_chain(tmp_path, signer, trust, prov):
    cfg = differential_config(
        tmp_path, CHAINED, keep_last=2, keep_best=True, best_metric="score", best_mode="max"
    )
    run_dir = _train(cfg, tmp_path, 6, signer, trust, prov, sparse_state(), score={6: 1})
    best = [p.name for _, p in scan(run_dir / BEST_DIR).committed]
    assert best == [step_dir_name(s) for s in (2, 4, 6)]
    chosen = choose.select(run_dir, "best", trust)
    assert chosen.path == run_dir / BEST_DIR / step_dir_name(6)
    assert_same(chosen.decoded.tree, choose.load(run_dir / step_dir_name(6), trust).decoded.tree)


def test_a_chain_longer_than_its_bound_is_refused(linked_run, trust, monkeypatch):
    linked, _, _ = linked_run
    mf = choose.load(linked / step_dir_name(6), trust).manifest
    calls = []

    def verify(p):
        calls.append(p)
        return choose.load(p, trust).verified

    assert [v.path.name for v in chain.read_chain(linked / step_dir_name(6), mf, verify)] == [
        step_dir_name(2),
        step_dir_name(4),
    ]
    monkeypatch.setattr(chain, "MAX_LINKS", 1)
    with pytest.raises(BrokenChainError, match="chain of at most 1 deltas"):
        chain.read_chain(linked / step_dir_name(6), mf, verify)


@pytest.mark.parametrize("link", [4, 6, 10, 12])
def test_a_resume_from_any_link_trains_the_same_run_bit_for_bit(
    tmp_path, signer, trust, prov, link
):
    """Killed after committing ``link`` (the first or second delta of a chain), resumed
    from it: every later checkpoint equals the uninterrupted run's."""
    ref = run(tmp_path / "ref", 16, signer, trust, prov, **CHAINED)
    run(tmp_path / "job", link, signer, trust, prov, **CHAINED)
    job = run(tmp_path / "job", 16, signer, trust, prov, resume_spec="latest", **CHAINED)
    resumed = [r for r in read(job / "metrics.jsonl") if r.get("event") == "resume"]
    assert resumed[-1]["step"] == link
    for step in range(link + 2, 17, 2):
        a = choose.load(ref / step_dir_name(step), trust)
        b = choose.load(job / step_dir_name(step), trust)
        assert (a.delta or {}).get("chain") == (b.delta or {}).get("chain"), step
        assert_same(a.decoded.tree, b.decoded.tree)


def test_a_best_whose_chain_collides_with_the_kept_best_after_a_branch_is_not_copied(
    tmp_path, signer, trust, prov, caplog
):
    """A branch from step 2 writes 4 and 6 again: a new best at 6 stands on another step 4
    than the kept best does. Copying its chain would replace the kept best's link in place,
    so it is not copied, and the kept best stays whole."""
    cfg = differential_config(
        tmp_path, CHAINED, keep_last=10, keep_best=True, best_metric="score", best_mode="max"
    )
    run_dir = _train(cfg, tmp_path, 6, signer, trust, prov, sparse_state(), score={6: 1})
    best = run_dir / BEST_DIR
    kept = {p.name: choose.load(p, trust).manifest.root for _, p in scan(best).committed}
    assert sorted(kept) == [step_dir_name(s) for s in (2, 4, 6)]
    _train(cfg, tmp_path, 8, signer, trust, prov, sparse_state(), resume_spec=2, score={6: 5})
    assert "is not copied as the best" in caplog.text
    now = {p.name: choose.load(p, trust).manifest.root for _, p in scan(best).committed}
    assert now == kept
    assert choose.select(run_dir, "best", trust).path == best / step_dir_name(6)
