"""The embedding recipe's exporter: ``recovery export`` runs :func:`run` (``export.exporter``).

Builds the serving module from the chosen continuation checkpoint: raw user
and item ids in, scores out, with the id-to-row lookup inside the program, so
the artifact serves without this project's code. Unknown ids are explicit: the
score is NaN and ``known`` is false. After writing, it loads the artifact back
through :func:`recovery.tools.export.load_inference` and checks parity on held-out
interactions (predictions within the dtype's tolerance of the training model,
held-out log loss within tolerance of the value recorded at training time);
on a miss it deletes the artifact and fails, showing both numbers.
"""

from __future__ import annotations

import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from recipes.data import Interactions, load
from recipes.embedding import DotProduct, EmbeddingConfig
from recovery.config import CheckpointConfig, RunConfig, SigningConfig, typed
from recovery.config.checks import refuse
from recovery.errors import ConfigError, ExportError
from recovery.integrity.keys import trust
from recovery.parallel import sharded
from recovery.run.restoring import choose
from recovery.tools import export

log = logging.getLogger(__name__)


@dataclass(kw_only=True)
class ExportConfig:
    source: str = "latest"
    """``latest`` or a step number."""
    dtype: str = "float32"
    """Serving precision: float32, bfloat16 or float16."""
    out: str = "artifacts/default"
    """Where the artifact directory is written."""
    exporter: Any = None
    """The ``_target_`` node ``recovery export`` instantiates (this module's :func:`run`)."""

    def __post_init__(self) -> None:
        if self.dtype not in export.DTYPES:
            raise refuse(
                "export.dtype",
                f"expected one of {sorted(export.DTYPES)}, got {self.dtype!r}",
                "float32",
            )
        if not str(self.out).strip():
            raise refuse("export.out", "must be a directory path, got an empty string", "artifacts")
        choose.parse_spec(self.source, "export.source")


class Serving(nn.Module):
    """Raw ids -> (score, known): the id lookup, the embeddings and the score, in one program."""

    def __init__(
        self, weights: dict[str, torch.Tensor], user_ids: torch.Tensor, item_ids: torch.Tensor
    ) -> None:
        super().__init__()
        self.register_buffer("user_ids", user_ids.clone())
        self.register_buffer("item_ids", item_ids.clone())
        for name in ("user.weight", "item.weight", "user_bias.weight", "item_bias.weight", "bias"):
            self.register_buffer(name.replace(".", "_"), weights[name].clone())

    @staticmethod
    def _lookup(table: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        row = torch.searchsorted(table, ids).clamp(max=table.shape[0] - 1)
        return row, table[row] == ids

    def forward(
        self, user_id: torch.Tensor, item_id: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b: dict[str, torch.Tensor] = dict(self.named_buffers())
        u, known_u = self._lookup(b["user_ids"], user_id)
        i, known_i = self._lookup(b["item_ids"], item_id)
        score = (
            (b["user_weight"][u] * b["item_weight"][i]).sum(-1)
            + b["user_bias_weight"][u].squeeze(-1)
            + b["item_bias_weight"][i].squeeze(-1)
            + b["bias"]
        ).float()
        known = known_u & known_i
        return torch.where(known, score, torch.full_like(score, math.nan)), known


SIGNATURE = {
    "inputs": [
        {"name": "user_id", "dtype": "int64", "shape": [-1]},
        {"name": "item_id", "dtype": "int64", "shape": [-1]},
    ],
    "outputs": [
        {"name": "score", "dtype": "float32", "shape": [-1]},
        {"name": "known", "dtype": "bool", "shape": [-1]},
    ],
    "unknown_ids": "score is NaN and known is false when the user or item id is not catalogued",
    "score": "logit of an interaction; sigmoid(score) is its probability",
}


def spec_for(tree: dict[str, Any], data: Interactions, dtype: torch.dtype) -> export.ExportSpec:
    """The serving module and files for a checkpoint's model state."""
    weights = {k: v.to(dtype) for k, v in tree["model"].items()}
    module = Serving(weights, data.user_ids, data.item_ids).eval()
    n = torch.export.Dim("n", min=1)
    return export.ExportSpec(
        module=module,
        example_inputs=(data.user_ids[:4].clone(), data.item_ids[:4].clone()),
        dynamic_shapes=({0: n}, {0: n}),
        signature=SIGNATURE,
        weights=weights,
        preprocessing={"user_id": data.user_ids, "item_id": data.item_ids},
    )


def parity(
    predictor: export.Predictor,
    tree: dict[str, Any],
    rc: EmbeddingConfig,
    data: Interactions,
    *,
    dtype: str,
    recorded: float | None,
) -> dict[str, float]:
    """Compare the artifact with the training model on held-out interactions.

    Raises:
        ExportError: predictions or the held-out metric out of tolerance, with both numbers.
    """
    part = data.holdout
    users, items, labels = data.users[part], data.items[part], data.labels[part]
    model = DotProduct(rc.data.num_users, rc.data.num_items, rc.model.dim, rc.model.dropout)
    model.load_state_dict(tree["model"])
    model.eval()
    with torch.no_grad():
        expected = model(users, items)
    got = predictor(user_id=data.user_ids[users], item_id=data.item_ids[items])
    score = got["score"]
    atol, rtol, metric_tol = export.TOLERANCE[dtype]
    if not bool(got["known"].all()):
        raise ExportError("parity: the artifact calls known ids unknown")
    worst = float((score - expected).abs().max())
    if not torch.allclose(score, expected, atol=atol, rtol=rtol):
        raise ExportError(
            f"parity: artifact predictions differ from the training model by up to {worst:.3g} "
            f"(tolerance atol={atol}, rtol={rtol} for {dtype})"
        )
    result = {"max_abs_diff": worst}
    if recorded is not None:
        metric = float(nn.functional.binary_cross_entropy_with_logits(score, labels))
        result["val_logloss"] = metric
        if abs(metric - recorded) > metric_tol:
            raise ExportError(
                f"parity: held-out log loss {metric:.6f} from the artifact, {recorded:.6f} "
                f"recorded at training time (tolerance {metric_tol} for {dtype})"
            )
    return result


def run(cfg: DictConfig) -> int:
    """Export the checkpoint ``export.source`` of run ``run.name``; check parity; return 0."""
    rc = typed(EmbeddingConfig, cfg.recipe, key="recipe")
    ck = typed(CheckpointConfig, cfg.checkpoint, key="checkpoint")
    run_cfg = typed(RunConfig, cfg.run, key="run")
    ex = typed(ExportConfig, cfg.export, key="export")
    signing_cfg = typed(SigningConfig, cfg.signing, key="signing")
    run_dir = Path(ck.root) / run_cfg.name
    signer = trust.resolve_signer(signing_cfg, near=[run_dir], create_in=trust.PROJECT_DEV_KEY)
    keys = trust.resolve_trust(signing_cfg, signer)
    source = choose.select(
        run_dir, ex.source, keys, allow_untrusted=signing_cfg.allow_untrusted, key="export.source"
    )
    if source is None:
        raise ConfigError(
            f"export: no verified checkpoint in {run_dir}; train first (python train.py)"
        )
    data = load(rc.data, create=False)
    # a torchrun checkpoint keeps its weights in dcp/: read them whole, here
    tree = sharded.tree_with_model(
        source.decoded.tree, source.files, source.decoded.meta, where=source.path
    )
    out = Path(ex.out)
    export.write_artifact(
        out,
        source,
        spec_for(tree, data, export.DTYPES[ex.dtype]),
        dtype=ex.dtype,
        signer=signer,
        root=Path(ck.root),
    )
    try:
        predictor = export.load_inference(out, keys)
        recorded = source.decoded.meta.get("metrics", {}).get("val_logloss")
        result = parity(
            predictor,
            tree,
            rc,
            data,
            dtype=ex.dtype,
            recorded=recorded,
        )
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)  # a failed artifact is never left for DVC to cache
        raise
    log.info(
        "exported %s (step %d, %s) to %s; parity: %s",
        source.path,
        source.decoded.step,
        ex.dtype,
        out,
        ", ".join(
            f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()
        ),
    )
    return 0
