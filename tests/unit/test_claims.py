"""Which listed files ``state.json`` claims (recovery.format.claims), for every layout."""

from __future__ import annotations

import json

import pytest

from recovery.errors import FormatError
from recovery.format import claims, shards


def unclaimed(files: dict[str, bytes]):
    return claims.unclaimed(files, files.get, where="ckpt")


def state(**doc) -> bytes:
    return json.dumps({"format": 1, "step": 1, "components": {}, **doc}).encode()


def test_a_checkpoint_claims_its_components_and_roles():
    files = {
        "state.json": state(components={"model": {}, "optimizer": {}, "sampler": {}}),
        "config.yaml": b"",
        "model.safetensors": b"",
        "optimizer.safetensors": b"",
    }
    assert unclaimed(files) == []
    files |= {"sampler.safetensors": b"", "extra.safetensors": b"", "program.pt2": b""}
    assert unclaimed(files) == ["extra.safetensors", "program.pt2"]


def test_shards_are_claimed_through_their_index_only():
    names = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    index = json.dumps({"weight_map": names}).encode()
    files = {
        "state.json": state(components={"model": {}}),
        shards.index_name("model"): index,
        "model-00001-of-00002.safetensors": b"",
        "model-00002-of-00002.safetensors": b"",
    }
    assert unclaimed(files) == []
    assert unclaimed({**files, "model-00003-of-00003.safetensors": b""}) == [
        "model-00003-of-00003.safetensors"
    ]
    files[shards.index_name("model")] = b'{"weight_map": {"a": "../x.safetensors"}}'
    with pytest.raises(FormatError, match="not a shard of model"):
        unclaimed(files)


def test_a_distributed_checkpoint_claims_dcp_and_ranks_below_its_world_size():
    files = {
        "state.json": state(distributed={"world_size": 2, "dcp": "dcp"}),
        "dcp/.metadata": b"",
        "dcp/__0_0.distcp": b"",
        "dcp/__1_0.distcp": b"",
        "dcp/__1_1.distcp": b"",
        "ranks/rank-00000.json": b"",
        "ranks/rank-00001.safetensors": b"",
    }
    assert unclaimed(files) == []
    beyond = {"dcp/__2_0.distcp": b"", "ranks/rank-00002.json": b"", "dcp/notes": b""}
    assert unclaimed({**files, **beyond}) == sorted(beyond)
    files["state.json"] = state()  # the same files without the record: none claimed
    assert unclaimed(files) == sorted(set(files) - {"state.json"})


def test_an_inference_artifact_claims_its_program_and_signature():
    files = {
        "state.json": state(components={"model": {}, "preprocessing": {}}, export={}),
        "model.safetensors": b"",
        "program.pt2": b"",
        "signature.json": b"",
    }
    assert unclaimed(files) == []


@pytest.mark.parametrize("doc", [None, b"{}", b"[]", b"not json", b'{"components": []}'])
def test_no_state_document_no_verdict(doc):
    """Not this tool's state: the decoder refuses it, so nothing is claimed or refused here."""
    files = {"model.safetensors": b""} | ({"state.json": doc} if doc is not None else {})
    assert unclaimed(files) is None
