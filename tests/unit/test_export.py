"""Export pieces that need no pipeline: the pickle guard, the program, parity failures."""

import io
import pickle
import zipfile

import pytest
import torch

from recipes.data import DataConfig, generate, load
from recipes.embedding import DotProduct, EmbeddingConfig
from recipes.export import parity, spec_for
from recovery.errors import ExportError, FormatError
from recovery.tools import export


def test_program_holds_no_pickle_and_serves_raw_ids(tmp_path):
    cfg = DataConfig(
        root=str(tmp_path / "d"), num_users=30, num_items=20, num_interactions=400, shards=1
    )
    generate(cfg)
    data = load(cfg)
    model = DotProduct(30, 20, 4, 0.0)
    spec = spec_for({"model": model.state_dict()}, data, torch.float32)
    blob = export.program_bytes(spec)
    export.check_no_pickle(blob, name="p")  # does not raise
    program = torch.export.load(io.BytesIO(blob)).module()
    score, known = program(
        torch.tensor([data.user_ids[3], 1]), torch.tensor([data.item_ids[2], data.item_ids[2]])
    )
    with torch.no_grad():
        expected = model(torch.tensor([3]), torch.tensor([2]))
    assert torch.equal(score[:1], expected) and known.tolist() == [True, False]
    assert torch.isnan(score[1])


def test_pickle_in_an_archive_is_refused():
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/models/model.json", b"{}")
        z.writestr("archive/data/evil.pkl", pickle.dumps({"x": 1}))
    with pytest.raises(FormatError, match="evil.pkl holds a pickle"):
        export.check_no_pickle(buf.getvalue(), name="program.pt2")
    with pytest.raises(FormatError, match="zip"):
        export.check_no_pickle(b"not a zip", name="program.pt2")


def test_parity_failure_names_both_numbers(tmp_path):
    cfg = DataConfig(
        root=str(tmp_path / "d"), num_users=30, num_items=20, num_interactions=400, shards=1
    )
    generate(cfg)
    data = load(cfg)
    rc = EmbeddingConfig(data=cfg)
    rc.model.dim = 4
    model = DotProduct(30, 20, 4, 0.0)
    tree = {"model": model.state_dict()}
    spec = spec_for(tree, data, torch.float32)
    program = torch.export.load(io.BytesIO(export.program_bytes(spec))).module()
    predictor = export.Predictor(tmp_path, program, spec.signature)
    result = parity(predictor, tree, rc, data, dtype="float32", recorded=None)
    assert result["max_abs_diff"] == 0.0
    with pytest.raises(
        ExportError, match=r"held-out log loss .* from the artifact, 9\.000000 recorded"
    ):
        parity(predictor, tree, rc, data, dtype="float32", recorded=9.0)
    other = {"model": {k: v + 1.0 for k, v in tree["model"].items()}}
    with pytest.raises(ExportError, match="differ from the training model by up to"):
        parity(predictor, other, rc, data, dtype="float32", recorded=None)
