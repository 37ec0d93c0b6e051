"""The classifier recipe: a small CNN on real digit images, augmented inside DataLoader workers.

The images are scikit-learn's ``load_digits`` (1,797 8x8 digits that ship with
the package: no download). Augmentation (a random shift within a one-pixel
pad, and Gaussian noise) runs in DataLoader worker processes, the hard case
for exact resume: its randomness is keyed by (seed, epoch, example id) alone,
never by a worker's own generator, so a resume is exact and any
``num_workers`` yields the same batches.

The batch order comes from the :class:`~recovery.state.sampler.ResumableSampler`.
The DataLoader is handed the rest of the current epoch's batches as a fixed
list (prefetching workers must not move the checkpointed cursor); the training
loop advances the cursor itself as it consumes each batch, and checks they agree.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader, Dataset

from recipes import common
from recipes.common import seed_everything, warmup_cosine
from recipes.outcome import Outcome
from recovery.config import TrainConfig, typed
from recovery.config.checks import at_least, check_seed, positive, refuse, within
from recovery.errors import ConfigError
from recovery.state.registry import TrainState
from recovery.state.sampler import ResumableSampler

log = logging.getLogger(__name__)

FIXED_ON_RESUME = {"recipe.lr": "the optimizer's and LR schedule's state"}
"""Keys a resume restores from the checkpoint, whatever the command line says."""


DIGITS = 1797
"""Images in scikit-learn's digits data set."""


@dataclass(kw_only=True)
class ClassifierConfig:
    name: str = "classifier"
    batch_size: int = 64
    num_workers: int = 2
    """DataLoader worker processes doing the augmentation (0: in the training process)."""
    val_size: int = 297
    """Held-out images (the last ones of a fixed shuffle) for validation."""
    data_seed: int = 7
    """Seed of the fixed train/validation split."""
    noise: float = 0.05
    """Std of the augmentation noise (pixels in [0, 1])."""
    lr: float = 0.003
    warmup_steps: int = 20
    min_lr_ratio: float = 0.05
    dropout: float = 0.2
    amp: bool = False
    """bfloat16 autocast with a GradScaler (its state is checkpointed too)."""
    eval_every: int = 50
    """Log a validation line every this many steps (checkpoints always record validation)."""

    def __post_init__(self) -> None:
        for key, example in (("batch_size", 64), ("val_size", 297), ("eval_every", 50)):
            positive(f"recipe.{key}", getattr(self, key), example)
        positive("recipe.lr", self.lr, 0.003)
        at_least("recipe.num_workers", self.num_workers, 0, 2, " (0: in the training process)")
        at_least("recipe.warmup_steps", self.warmup_steps, 0, 20)
        at_least("recipe.noise", self.noise, 0, 0.05)
        within("recipe.min_lr_ratio", self.min_lr_ratio, 0.0, 1.0)
        within("recipe.dropout", self.dropout, 0.0, 1.0, open_high=True)
        check_seed(self.data_seed, "recipe.data_seed")
        if self.val_size >= DIGITS:
            raise refuse(
                "recipe.val_size",
                f"must be below the data set's {DIGITS} images (some must train), "
                f"got {self.val_size}",
                297,
            )


@dataclass(frozen=True)
class Digits:
    """The images split once, deterministically, into training and validation."""

    images: torch.Tensor
    labels: torch.Tensor
    num_train: int
    source: Path = field(default=Path("sklearn.datasets.load_digits"))


def load_digits(cfg: ClassifierConfig) -> Digits:
    from sklearn.datasets import load_digits as sk_load

    raw = sk_load()
    order = np.random.default_rng(cfg.data_seed).permutation(len(raw.target))
    images = torch.from_numpy((raw.images[order] / 16.0).astype(np.float32)).unsqueeze(1)
    labels = torch.from_numpy(raw.target[order].astype(np.int64))
    if cfg.val_size >= len(labels):
        raise ConfigError(f"recipe.val_size: {cfg.val_size} leaves no training images")
    import sklearn

    source = Path(sklearn.__file__).parent / "datasets" / "data" / "digits.csv.gz"
    return Digits(images, labels, len(labels) - cfg.val_size, source)


def _key(seed: int, epoch: int, index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{epoch}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class Augmented(Dataset[tuple[torch.Tensor, int, int]]):
    """Training images, augmented by a generator seeded from (seed, epoch, id) alone."""

    def __init__(self, digits: Digits, *, seed: int, noise: float) -> None:
        self.digits = digits
        self.seed = seed
        self.noise = noise

    def __len__(self) -> int:
        return self.digits.num_train

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int, int]:
        epoch, index = key
        g = torch.Generator().manual_seed(_key(self.seed, epoch, index))
        image = nn.functional.pad(self.digits.images[index], (1, 1, 1, 1))
        dy, dx = (int(v) for v in torch.randint(0, 3, (2,), generator=g))
        image = image[:, dy : dy + 8, dx : dx + 8]
        image = image + self.noise * torch.randn(image.shape, generator=g)
        return image, int(self.digits.labels[index]), index


class CNN(nn.Module):
    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(dropout), nn.Linear(32 * 4 * 4, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


def epoch_batches(sampler: ResumableSampler) -> list[list[tuple[int, int]]]:
    """The rest of the current epoch's batches, as (epoch, id) keys, without moving the cursor."""
    return [[(sampler.epoch, int(i)) for i in ids] for ids in sampler.rest_of_epoch()]


def validate(model: nn.Module, digits: Digits) -> dict[str, float]:
    """Validation loss and accuracy on the held-out images (no augmentation, no RNG draw)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            x = digits.images[digits.num_train :]
            y = digits.labels[digits.num_train :]
            logits = model(x)
            return {
                "val_loss": float(nn.functional.cross_entropy(logits, y)),
                "val_acc": float((logits.argmax(-1) == y).float().mean()),
            }
    finally:
        model.train(was_training)


def run(cfg: DictConfig) -> Outcome:
    """Train (or resume, or warm-start) the classifier recipe as ``cfg`` says; return 0."""
    rc = typed(ClassifierConfig, cfg.recipe, key="recipe")
    steps = typed(TrainConfig, cfg.train, key="train").steps
    seed = int(cfg.seed)
    digits = load_digits(rc)
    seed_everything(seed)
    model = CNN(rc.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=rc.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(rc.warmup_steps, steps, rc.min_lr_ratio)
    )
    sampler = ResumableSampler(digits.num_train, rc.batch_size, seed)
    scaler = torch.amp.GradScaler("cpu") if rc.amp else None
    state = TrainState(model=model, optimizer=opt, scheduler=sched, sampler=sampler, scaler=scaler)
    dataset = Augmented(digits, seed=seed, noise=rc.noise)
    loss_fn = nn.CrossEntropyLoss()
    batches: Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = iter(())
    loaded_epoch = -1

    def one_step() -> common.StepResult:
        nonlocal batches, loaded_epoch
        if loaded_epoch != sampler.epoch:
            loader: DataLoader[Any] = DataLoader(
                dataset,
                batch_sampler=epoch_batches(sampler),
                num_workers=rc.num_workers,
                persistent_workers=False,
                # a loader draws its workers' base seed when it starts; from its own generator,
                # not the global one, or a resume (a loader started mid-epoch) would shift
                # the dropout stream. Augmentation does not use worker seeds at all.
                generator=torch.Generator().manual_seed(seed),
            )
            batches, loaded_epoch = iter(loader), sampler.epoch
        images, labels, ids = next(batches)
        epoch, expected = sampler.next_batch()
        if ids.tolist() != expected.tolist():  # the loader and the cursor must agree
            raise RuntimeError(
                f"loader batch {ids.tolist()[:4]} != cursor batch {expected.tolist()[:4]}"
            )
        lr = float(opt.param_groups[0]["lr"])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=rc.amp):
            loss = loss_fn(model(images), labels)
        opt.zero_grad(set_to_none=True)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        sched.step()
        if sampler.epoch != epoch:
            loaded_epoch = -1  # the epoch ended: the next step builds the next epoch's loader
        return common.StepResult(epoch, ids.tolist(), float(loss.item()), lr)

    model.train()
    return common.train(
        cfg,
        state,
        one_step,
        metrics=lambda loss: {"loss": loss, **validate(model, digits)},
        data_root=digits.source,
        model_cfg={"recipe": "classifier", "class": "CNN", "dropout": rc.dropout},
        examples=len(digits.labels),
        best_metric="val_loss",
        fixed_on_resume=FIXED_ON_RESUME,
    )
