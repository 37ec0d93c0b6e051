"""``recovery import``: every source kind becomes a signed warm-start artifact that a new run
starts from; every bad source is refused before anything in it is unpickled."""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest
import safetensors.torch
import torch

from recovery import cli
from recovery.config import CheckpointConfig
from recovery.errors import CheckpointNotFoundError, ConfigError, FormatError, UnsafePathError
from recovery.format import pickles
from recovery.run.checkpointer import Checkpointer
from recovery.run.restoring import choose
from recovery.tools import audit, importing
from tests.conftest import tiny_state, train_steps


class Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def weights():
    """A trained tiny model's state dict (the weights to bring in)."""
    state = tiny_state(seed=7)
    train_steps(state, 2)
    return {k: v.clone() for k, v in state.components["model"].state_dict().items()}


@pytest.fixture
def no_unpickling(monkeypatch):
    """Fail the test if torch.load is ever reached."""
    calls = []
    monkeypatch.setattr(pickles.torch, "load", lambda *a, **k: calls.append(a) or 1 / 0)
    return calls


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def warm_start(tmp_path, artifact, signer, trust, prov):
    """A new run initialised from ``artifact`` via the API: its state and start step."""
    state = tiny_state(seed=1)
    ck = Checkpointer(
        CheckpointConfig(root=str(tmp_path), every_steps=2),
        tmp_path / "ft",
        final_step=2,
        signer=signer,
        trust=trust,
        provenance=prov,
        config={"seed": 1},
        model_config={"width": 4},
    )
    step = ck.restore(state, init_from=artifact)
    return state, step, ck


def same(model_sd, weights):
    assert model_sd.keys() == weights.keys()
    for k, v in weights.items():
        assert torch.equal(model_sd[k], v), k


def test_torch_save_state_dict_warm_starts_a_new_run(tmp_path, weights, signer, trust, prov):
    torch.save(weights, tmp_path / "w.pt")
    out = tmp_path / "imported"
    result = importing.import_weights(tmp_path / "w.pt", out, signer=signer)
    state, step, ck = warm_start(tmp_path, out, signer, trust, prov)
    assert step == 0
    same(state.components["model"].state_dict(), weights)
    assert state.components["optimizer"].state_dict()["state"] == {}  # fresh
    assert ck.identity.parent["kind"] == "warm_start"
    assert ck.identity.lineage[0]["kind"] == "import"
    rec = result.record
    assert rec["kind"] == "torch" and rec["layout"] == "zip" and rec["origin"] == "unverified"
    assert rec["files"] == [
        {
            "name": "w.pt",
            "sha256": sha(tmp_path / "w.pt"),
            "size": (tmp_path / "w.pt").stat().st_size,
        }
    ]
    ck.close()


def test_provenance_is_signed_and_audit_says_imported(tmp_path, weights, signer, trust, capsys):
    torch.save(weights, tmp_path / "w.pt")
    out = tmp_path / "imported"
    importing.import_weights(tmp_path / "w.pt", out, signer=signer)
    loaded = choose.load(out, trust)
    assert loaded.manifest.purpose == "warm_start"
    assert {"model", "model_config", "provenance"} <= set(loaded.components)
    imported = loaded.manifest.recovery["provenance"]["imported"]
    assert imported["sha256"] and imported["files"][0]["sha256"] == sha(tmp_path / "w.pt")
    assert imported["origin"] == "unverified"
    assert loaded.decoded.meta["model_config"] == {"imported": "torch", "config": None}
    report = audit.audit(out, trust)
    assert report.ok and report.links[0].imported["origin"] == "unverified"
    keys = ["--trusted", str(signer.path.parent)]
    assert cli.main(["audit", str(out), *keys]) == 0
    text = capsys.readouterr().out
    assert "imported from torch" in text and "origin unverified" in text and "result: OK" in text
    assert cli.main(["verify", str(out), *keys]) == 0


def test_a_run_warm_started_from_an_import_audits_back_to_it(
    tmp_path, weights, signer, trust, prov
):
    torch.save(weights, tmp_path / "w.pt")
    out = tmp_path / "imports" / "tiny"
    importing.import_weights(tmp_path / "w.pt", out, signer=signer)
    state, step, ck = warm_start(tmp_path, out, signer, trust, prov)
    while step < 2:
        train_steps(state, 1)
        step += 1
        ck.maybe_save(state, step)
    ck.close()
    report = audit.audit(tmp_path / "ft" / "step-00000002", trust, root=tmp_path)
    assert report.ok, [link.error for link in report.failures]
    assert report.lineage[0]["kind"] == "import"
    assert report.links[-1].imported is not None and report.links[-1].drift == []


def lightning(weights, **extra):
    return {
        "epoch": 3,
        "global_step": 120,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": {**{f"model.{k}": v for k, v in weights.items()}, "ema.w": torch.ones(2)},
        "optimizer_states": [{"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": []}],
        "lr_schedulers": [],
        "callbacks": {"ModelCheckpoint": {"best_model_score": torch.tensor(0.5)}},
        "loops": {},
        "hparams_name": "kwargs",
        "hyper_parameters": {"width": 4, "lr": 0.01},
        **extra,
    }


def test_lightning_ckpt_with_prefix_strip(tmp_path, weights, signer, trust, prov):
    torch.save(lightning(weights), tmp_path / "epoch=3.ckpt")
    out = tmp_path / "imported"
    result = importing.import_weights(
        tmp_path / "epoch=3.ckpt", out, signer=signer, strip_prefix="model."
    )
    rec = result.record
    assert rec["kind"] == "lightning" and rec["key"] == "state_dict"
    assert rec["dropped"] == ["ema.w"] and rec["dropped_count"] == 1
    assert rec["model_config_from"] == "hyper_parameters"
    assert choose.load(out, trust).decoded.meta["model_config"] == {"width": 4, "lr": 0.01}
    state, _, ck = warm_start(tmp_path, out, signer, trust, prov)
    same(state.components["model"].state_dict(), weights)
    ck.close()


def test_a_prefix_nothing_has_is_refused_naming_the_prefixes(tmp_path, weights, signer):
    torch.save(lightning(weights), tmp_path / "l.ckpt")
    with pytest.raises(ConfigError, match=r"'encoder\.'.*'ema\.', 'model\.'"):
        importing.import_weights(
            tmp_path / "l.ckpt", tmp_path / "o", signer=signer, strip_prefix="encoder."
        )
    assert not (tmp_path / "o").exists()


def test_lightning_hyper_parameters_with_objects_are_refused_before_unpickling(
    tmp_path, weights, signer, no_unpickling
):
    # a Path in hparams: Lightning saves what the module was given; the whole pickle is
    # scanned, so the checkpoint is refused, naming the global (decided: no partial load)
    torch.save(lightning(weights, hyper_parameters={"data": Path("/d")}), tmp_path / "l.ckpt")
    with pytest.raises(FormatError, match=r"l\.ckpt.*pathlib\.PosixPath.*nothing was unpickled"):
        importing.import_weights(tmp_path / "l.ckpt", tmp_path / "o", signer=signer)
    assert no_unpickling == []


def test_safetensors_file(tmp_path, weights, signer, trust, prov):
    safetensors.torch.save_file(weights, tmp_path / "w.safetensors", metadata={"format": "pt"})
    out = tmp_path / "imported"
    result = importing.import_weights(tmp_path / "w.safetensors", out, signer=signer)
    assert result.record["kind"] == "safetensors"
    assert result.record["files"][0]["sha256"] == sha(tmp_path / "w.safetensors")
    state, _, ck = warm_start(tmp_path, out, signer, trust, prov)
    same(state.components["model"].state_dict(), weights)
    ck.close()


def hf_dir(tmp_path, weights, layout):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "tiny", "hidden_size": 4}))
    (d / "tokenizer.json").write_text("{}")  # not weights: never read
    if layout == "single":
        safetensors.torch.save_file(weights, d / "model.safetensors", metadata={"format": "pt"})
    elif layout == "sharded":
        names = sorted(weights)
        parts = {"model-00001-of-00002.safetensors": names[:2]}
        parts["model-00002-of-00002.safetensors"] = names[2:]
        weight_map = {}
        for shard, keys in parts.items():
            safetensors.torch.save_file({k: weights[k] for k in keys}, d / shard)
            weight_map |= dict.fromkeys(keys, shard)
        index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
        (d / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        torch.save(weights, d / "pytorch_model.bin")
    return d


@pytest.mark.parametrize(
    ("layout", "read"),
    [
        ("single", ["model.safetensors", "config.json"]),
        (
            "sharded",
            [
                "model.safetensors.index.json",
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors",
                "config.json",
            ],
        ),
        ("bin", ["pytorch_model.bin", "config.json"]),
    ],
)
def test_hf_directory(tmp_path, weights, signer, trust, prov, layout, read):
    d = hf_dir(tmp_path, weights, layout)
    out = tmp_path / "imported"
    result = importing.import_weights(d, out, signer=signer)
    rec = result.record
    assert rec["kind"] == "hf" and rec["model_config_from"] == "config.json"
    assert [(f["name"], f["sha256"]) for f in rec["files"]] == [(n, sha(d / n)) for n in read]
    loaded = choose.load(out, trust)
    assert loaded.decoded.meta["model_config"] == {"model_type": "tiny", "hidden_size": 4}
    state, _, ck = warm_start(tmp_path, out, signer, trust, prov)
    same(state.components["model"].state_dict(), weights)
    ck.close()


def test_written_weights_carry_format_pt(tmp_path, weights, signer):
    torch.save(weights, tmp_path / "w.pt")
    importing.import_weights(tmp_path / "w.pt", tmp_path / "o", signer=signer)
    with safetensors.safe_open(tmp_path / "o" / "model.safetensors", "pt") as f:
        assert f.metadata() == {"format": "pt"}


def test_legacy_torch_save_format_imports(tmp_path, weights, signer):
    torch.save(weights, tmp_path / "w.pt", _use_new_zipfile_serialization=False)
    result = importing.import_weights(tmp_path / "w.pt", tmp_path / "o", signer=signer)
    assert result.record["layout"] == "legacy" and result.record["tensors"] == len(weights)


def test_every_dtype_we_store_passes_the_scan(tmp_path, signer):
    sd = {
        "f32": torch.randn(3),
        "bf16": torch.randn(3).to(torch.bfloat16),
        "f16": torch.randn(3).half(),
        "i64": torch.arange(3),
        "u8": torch.zeros(3, dtype=torch.uint8),
        "b": torch.ones(3, dtype=torch.bool),
        "f8": torch.zeros(3, dtype=torch.float8_e4m3fn),
        "p": torch.nn.Parameter(torch.ones(2)),
    }
    torch.save(sd, tmp_path / "w.pt")
    result = importing.import_weights(tmp_path / "w.pt", tmp_path / "o", signer=signer)
    assert result.record["tensors"] == len(sd)


# -- refused before anything is unpickled -----------------------------------------------


def payload_pickle(tmp_path, protocol):
    (tmp_path / "evil.pt").write_bytes(
        pickle.dumps({"w": Payload(tmp_path / "PWNED")}, protocol=protocol)
    )


def payload_in_zip(tmp_path, _):
    torch.save({"w": torch.ones(2), "x": Payload(tmp_path / "PWNED")}, tmp_path / "evil.pt")


def payload_in_legacy(tmp_path, _):
    obj = {"w": torch.ones(2), "x": Payload(tmp_path / "PWNED")}
    torch.save(obj, tmp_path / "evil.pt", _use_new_zipfile_serialization=False)


def payload_through_the_memo(tmp_path, _):
    # STACK_GLOBAL whose names come back from memo slots, after two POPs hid them
    body = b"\x80\x04\x8c\x08builtins\x94\x8c\x04eval\x94" + b"00" + b"h\x00h\x01\x93"
    body += b"\x8c\x011\x85R."
    (tmp_path / "evil.pt").write_bytes(body)


def payload_in_second_member(tmp_path, _):
    # a member torch.save never writes: refused by its name, before anything in it is read
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    with zipfile.ZipFile(tmp_path / "evil.pt", "w") as out:
        for info in src.infolist():
            out.writestr(info, src.read(info))
        out.writestr("archive/extra.pkl", pickle.dumps(Payload(tmp_path / "PWNED"), protocol=2))


@pytest.mark.parametrize(
    ("make", "protocol", "found"),
    [
        (payload_pickle, 2, "posix.system"),
        (payload_pickle, 5, "posix.system"),
        (payload_in_zip, None, "posix.system"),
        (payload_in_legacy, None, "posix.system"),
        (payload_through_the_memo, None, "builtins.eval"),
        (payload_in_second_member, None, "the member 'archive/extra.pkl'"),
    ],
)
def test_a_pickle_with_a_payload_is_refused_unexecuted(
    tmp_path, signer, no_unpickling, make, protocol, found
):
    make(tmp_path, protocol)
    with pytest.raises(FormatError, match=rf"evil\.pt.*{found}.*nothing was unpickled"):
        importing.import_weights(tmp_path / "evil.pt", tmp_path / "o", signer=signer)
    assert not (tmp_path / "PWNED").exists()
    assert no_unpickling == [] and not (tmp_path / "o").exists()


def test_a_global_whose_name_the_scan_cannot_read_is_refused():
    # STACK_GLOBAL over an int and a string: not names the scan can see
    with pytest.raises(FormatError, match="cannot read"):
        pickles.scan(b"\x80\x04K\x01\x8c\x01x\x93.", name="odd.pt")


def truncate(path: Path, keep: float) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize(
    ("name", "save", "found"),
    [
        ("w.pt", lambda sd, p: torch.save(sd, p), "truncated or corrupt"),
        ("w.pt", lambda sd, p: torch.save(sd, p, _use_new_zipfile_serialization=False), "whole"),
        ("w.safetensors", lambda sd, p: safetensors.torch.save_file(sd, p), "file size"),
    ],
)
def test_a_truncated_file_is_refused(tmp_path, weights, signer, no_unpickling, name, save, found):
    save(weights, tmp_path / name)
    truncate(tmp_path / name, 0.3 if name.endswith(".pt") else 0.9)
    with pytest.raises(FormatError, match=found):
        importing.import_weights(tmp_path / name, tmp_path / "o", signer=signer)
    assert no_unpickling == []


def test_a_plain_pickle_is_no_torch_save_file(tmp_path, signer, no_unpickling):
    (tmp_path / "w.pkl").write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    with pytest.raises(FormatError, match="found a plain pickle"):
        importing.import_weights(tmp_path / "w.pkl", tmp_path / "o", signer=signer)
    assert no_unpickling == []


def test_a_non_tensor_entry_is_refused_naming_it(tmp_path, weights, signer):
    torch.save({**weights, "epoch": 3}, tmp_path / "w.pt")
    with pytest.raises(FormatError, match=r"w\.pt: expected a state dict of tensors.*'epoch': int"):
        importing.import_weights(tmp_path / "w.pt", tmp_path / "o", signer=signer)


def test_a_nested_state_dict_is_pointed_at_and_key_picks_it(tmp_path, weights, signer):
    torch.save({"model": weights, "step": 3}, tmp_path / "w.pt")
    with pytest.raises(FormatError, match="--key model"):
        importing.import_weights(tmp_path / "w.pt", tmp_path / "o", signer=signer)
    result = importing.import_weights(tmp_path / "w.pt", tmp_path / "o", signer=signer, key="model")
    assert result.record["key"] == "model" and result.record["tensors"] == len(weights)
    with pytest.raises(ConfigError, match="no such entry"):
        importing.import_weights(tmp_path / "w.pt", tmp_path / "o2", signer=signer, key="nope")


def test_a_directory_without_known_files_is_refused(tmp_path, signer):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "vocab.txt").write_text("a")
    with pytest.raises(FormatError, match=r"model\.safetensors.*found vocab\.txt"):
        importing.import_weights(tmp_path / "d", tmp_path / "o", signer=signer)


def test_an_index_naming_a_path_out_of_the_directory_is_refused(tmp_path, weights, signer):
    d = hf_dir(tmp_path, weights, "sharded")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"][next(iter(index["weight_map"]))] = "../secret.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UnsafePathError, match="refusing a path out of the directory"):
        importing.import_weights(d, tmp_path / "o", signer=signer)


def test_a_shard_that_differs_from_its_index_is_refused(tmp_path, weights, signer):
    d = hf_dir(tmp_path, weights, "sharded")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["extra.weight"] = "model-00001-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match=r"absent: \['extra\.weight'\]"):
        importing.import_weights(d, tmp_path / "o", signer=signer)


def test_a_recovery_artifact_is_not_imported_again(tmp_path, weights, signer):
    torch.save(weights, tmp_path / "w.pt")
    importing.import_weights(tmp_path / "w.pt", tmp_path / "o", signer=signer)
    with pytest.raises(FormatError, match=r"a recovery artifact.*\+init_from="):
        importing.import_weights(tmp_path / "o", tmp_path / "o2", signer=signer)


def test_missing_source_and_existing_out(tmp_path, weights, signer):
    with pytest.raises(CheckpointNotFoundError):
        importing.import_weights(tmp_path / "nope.pt", tmp_path / "o", signer=signer)
    torch.save(weights, tmp_path / "w.pt")
    (tmp_path / "o").mkdir()
    with pytest.raises(ConfigError, match="already exists"):
        importing.import_weights(tmp_path / "w.pt", tmp_path / "o", signer=signer)


# -- the command line --------------------------------------------------------------------


def test_cli_imports_and_reports(tmp_path, weights, capsys):
    torch.save(lightning(weights), tmp_path / "l.ckpt")
    argv = ["import", str(tmp_path / "l.ckpt"), "--out", str(tmp_path / "o")]
    assert cli.main([*argv, "--strip-prefix", "model.", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["purpose"] == "warm_start" and out["imported"]["origin"] == "unverified"
    assert out["imported"]["files"][0]["sha256"] == sha(tmp_path / "l.ckpt")
    cfg = tmp_path / "model.json"
    cfg.write_text('{"width": 4}')
    argv[-1] = str(tmp_path / "o2")
    assert cli.main([*argv, "--strip-prefix", "model.", "--model-config", str(cfg)]) == 0
    text = capsys.readouterr().out
    assert f"model_config from {cfg}" in text and "dropped 1 others: ema.w" in text
    assert "+init_from=" in text


@pytest.mark.parametrize(
    ("make", "code"),
    [
        (lambda d: payload_in_zip(d, None), 10),
        (lambda d: (d / "evil.pt").write_bytes(b"PK\x03\x04 truncated"), 10),
        (lambda d: torch.save({"w": torch.ones(1), "n": "x"}, d / "evil.pt"), 10),
        (lambda d: None, 3),
    ],
)
def test_cli_refusals_are_one_line_with_their_code(tmp_path, capsys, make, code):
    make(tmp_path)
    assert cli.main(["import", str(tmp_path / "evil.pt"), "--out", str(tmp_path / "o")]) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and str(tmp_path / "evil.pt") in err
    assert "Traceback" not in err and not (tmp_path / "PWNED").exists()
