"""The interaction log the embedding recipe trains on, generated deterministically.

Users and items get seeded latent factors; each interaction is a (user, item)
pair, users uniform and items drawn by a Zipf-like popularity, labelled 1 with
probability sigmoid(scale * <u, v> + noise). The log is written as several
safetensors shard files plus ``meta.json``, into a temp directory renamed into
place, so an interrupted ``prepare`` never leaves half a dataset. Same config,
same bytes: the dataset's digest is a stable version.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import safetensors.numpy
import torch

from recovery.config.checks import at_least, check_seed, positive, refuse, within
from recovery.errors import ConfigError

log = logging.getLogger(__name__)

META_FILE = "meta.json"
IDS_FILE = "ids.safetensors"


@dataclass(kw_only=True)
class DataConfig:
    """How the interaction log is generated and where it lives."""

    root: str = "data/interactions"
    """Directory of the shard files."""
    num_users: int = 2000
    num_items: int = 1000
    num_interactions: int = 100_000
    shards: int = 4
    """Number of shard files the log is split into."""
    latent_dim: int = 8
    """Rank of the hidden user/item factors the labels come from."""
    signal: float = 3.0
    """Scale of the latent dot product in the label logit."""
    noise: float = 0.5
    """Std of the Gaussian noise added to the label logit."""
    seed: int = 1234
    """Generation seed (independent of the training seed)."""
    holdout: float = 0.05
    """Fraction of interactions (the last ones) held out for validation and export parity."""

    def __post_init__(self) -> None:
        defaults = {"num_users": 2000, "num_items": 1000, "num_interactions": 100_000}
        for name, example in {**defaults, "shards": 4, "latent_dim": 8}.items():
            positive(f"recipe.data.{name}", getattr(self, name), example)
        within("recipe.data.holdout", self.holdout, 0.0, 0.5, open_high=True)
        at_least("recipe.data.signal", self.signal, 0, 3.0)
        at_least("recipe.data.noise", self.noise, 0, 0.5)
        check_seed(self.seed, "recipe.data.seed")
        if not Path(str(self.root).strip()).name:  # '', '.', '/': no directory to write beside
            raise refuse(
                "recipe.data.root",
                f"expected a directory of its own for the interaction log, got {self.root!r}",
                "data/interactions",
            )
        if self.shards > self.num_interactions:
            raise refuse(
                "recipe.data.shards",
                f"{self.shards} shards for {self.num_interactions} interactions (at most one "
                "shard per interaction)",
                4,
            )


@dataclass(frozen=True)
class Interactions:
    """The whole log in memory, indexed by example id."""

    users: torch.Tensor
    items: torch.Tensor
    labels: torch.Tensor
    user_ids: torch.Tensor
    """Raw user id of each user index (what a serving request carries)."""
    item_ids: torch.Tensor
    """Raw item id of each item index."""
    num_train: int
    """Examples ``0 .. num_train - 1`` train; the rest are held out."""

    def __len__(self) -> int:
        return int(self.users.shape[0])

    @property
    def holdout(self) -> slice:
        return slice(self.num_train, len(self))


def _identity(cfg: DataConfig) -> dict[str, object]:
    spec = asdict(cfg)
    spec.pop("root")
    return spec


def generate(cfg: DataConfig) -> Path:
    """Write the log's shards and ``meta.json`` under ``cfg.root`` atomically."""
    rng = np.random.default_rng(cfg.seed)
    scale = 1.0 / np.sqrt(np.sqrt(cfg.latent_dim))
    user_f = rng.normal(size=(cfg.num_users, cfg.latent_dim)) * scale
    item_f = rng.normal(size=(cfg.num_items, cfg.latent_dim)) * scale
    popularity = 1.0 / np.arange(1, cfg.num_items + 1) ** 0.8
    popularity /= popularity.sum()
    users = rng.integers(0, cfg.num_users, size=cfg.num_interactions)
    items = rng.permutation(cfg.num_items)[
        rng.choice(cfg.num_items, size=cfg.num_interactions, p=popularity)
    ]
    logit = cfg.signal * np.einsum("nd,nd->n", user_f[users], item_f[items])
    logit += cfg.noise * rng.normal(size=cfg.num_interactions)
    labels = (rng.random(cfg.num_interactions) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    # raw ids as a catalogue would have them: sparse, not the row numbers used for training
    user_ids = np.sort(rng.choice(10**9, size=cfg.num_users, replace=False)).astype(np.int64)
    item_ids = np.sort(rng.choice(10**9, size=cfg.num_items, replace=False)).astype(np.int64)

    root = Path(cfg.root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = root.with_name(f"{root.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        bounds = np.linspace(0, cfg.num_interactions, cfg.shards + 1).astype(np.int64)
        for s in range(cfg.shards):
            lo, hi = bounds[s], bounds[s + 1]
            safetensors.numpy.save_file(
                {
                    "user": users[lo:hi].astype(np.int64),
                    "item": items[lo:hi].astype(np.int64),
                    "label": labels[lo:hi],
                },
                str(tmp / f"shard-{s:05d}.safetensors"),
            )
        safetensors.numpy.save_file({"user_id": user_ids, "item_id": item_ids}, str(tmp / IDS_FILE))
        (tmp / META_FILE).write_text(json.dumps(_identity(cfg), indent=1, sort_keys=True) + "\n")
        if root.exists():
            shutil.rmtree(root)
        os.rename(tmp, root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log.info("generated %d interactions in %d shards at %s", cfg.num_interactions, cfg.shards, root)
    return root


def load(cfg: DataConfig, *, create: bool = True) -> Interactions:
    """Read the log from ``cfg.root``, generating it first if absent and ``create``.

    Raises:
        ConfigError: the directory holds a log generated with other settings.
        FileNotFoundError: absent and not ``create``.
    """
    root = Path(cfg.root)
    meta_path = root / META_FILE
    if not meta_path.exists():
        if not create:
            raise FileNotFoundError(f"{meta_path}: no interaction log; run `dvc repro prepare`")
        generate(cfg)
    found = json.loads(meta_path.read_text())
    if found != _identity(cfg):
        diff = {k: (found.get(k), v) for k, v in _identity(cfg).items() if found.get(k) != v}
        raise ConfigError(
            f"{meta_path}: the log there was generated with other settings "
            f"(key: (on disk, config)) {diff}; delete {root} or point recipe.data.root elsewhere"
        )
    parts = [safetensors.numpy.load_file(str(p)) for p in sorted(root.glob("shard-*.safetensors"))]
    if len(parts) != cfg.shards:
        raise ConfigError(f"{root}: expected {cfg.shards} shard files, found {len(parts)}")
    ids = safetensors.numpy.load_file(str(root / IDS_FILE))
    n = sum(len(p["label"]) for p in parts)
    return Interactions(
        users=torch.from_numpy(np.concatenate([p["user"] for p in parts])),
        items=torch.from_numpy(np.concatenate([p["item"] for p in parts])),
        labels=torch.from_numpy(np.concatenate([p["label"] for p in parts])),
        user_ids=torch.from_numpy(ids["user_id"]),
        item_ids=torch.from_numpy(ids["item_id"]),
        num_train=n - round(n * cfg.holdout),
    )
