"""Hydra's basic sweeper, writing ``multirun.yaml`` without the secrets in it.

``hydra.output_subdir: null`` stops Hydra writing each job's ``.hydra/config.yaml``
and ``overrides.yaml``; but under ``-m`` Hydra's sweeper writes ``multirun.yaml``
(the sweep's whole config and its command line) whatever that setting says,
before any job runs, and ``+db.password=...`` on the command line landed there
in plain text. A callback cannot redact it in time without changing what the
jobs run with (Hydra reads the jobs' overrides from that same config after the
callbacks' ``on_multirun_start``). ``RedactingSweeper`` (``hydra.sweeper`` in
``conf/config.yaml``; a plugin in ``hydra_plugins/recovery_sweeper``, where Hydra
looks for them) is Hydra's basic sweeper whose own copy of the
config, the one it saves and nothing else reads, is redacted
(:func:`redacted_copy`) with the rules of a checkpoint's ``config.yaml``
(:func:`recovery.provenance.capture.redact`): values under secret-looking keys,
values given on the command line to secret-looking keys, and each of those
values wherever else it reached (the recorded overrides, ``override_dirname``).
The launcher keeps the real config: the jobs run with the real values; the
line the launcher logs for each job (``#0 : seed=0 +db.password=...``) is masked
(:class:`MaskSecrets`).
When the jobs are done the sweeper also says how each went, one line per job
(:func:`job_line`: what its ``train.py`` returned, its overrides redacted).
A sweep with another sweeper plugin (Optuna, Ax) does not get this: pass secrets
through the environment (``${oc.env:DB_PASSWORD}``) there.
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig, OmegaConf

from recovery.provenance.capture import mask, redact, redact_overrides, secret_values

LAUNCHER_LOGGER = "hydra._internal.core_plugins.basic_launcher"
"""The logger Hydra's basic launcher prints each job's overrides with (``#0 : ...``)."""


class MaskSecrets(logging.Filter):
    """Masks secret values in the records of the logger it is added to."""

    def __init__(self, secrets: set[str]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        # each override on the line redacted by its key (a sweep's value, ``+db.password=a``
        # of ``a,b``, is no whole secret known in advance), then any known secret masked
        words = [redact_overrides([w])[0] if "=" in w else w for w in text.split(" ")]
        masked = mask(" ".join(words), self.secrets)
        if masked != text:
            record.msg, record.args = masked, ()
        return True


def secrets_of(config: DictConfig) -> set[str]:
    """The secret values of a sweep's ``config``: under secret-looking keys, and given on
    the command line to secret-looking keys."""
    whole = OmegaConf.to_container(config, resolve=False)
    assert isinstance(whole, dict)
    secrets = secret_values({k: v for k, v in whole.items() if k != "hydra"})
    overrides = (whole.get("hydra") or {}).get("overrides") or {}
    for item in [*overrides.get("task", []), *overrides.get("hydra", [])]:
        if redact_overrides([item])[0] != item:  # a secret given on the command line
            secrets.add(item.partition("=")[2])
    return secrets


def redacted_copy(config: DictConfig, secrets: set[str]) -> DictConfig:
    """A copy of a sweep's ``config`` with every secret redacted (``hydra.overrides`` and
    every string a secret reached included); interpolations stay, resolved as the
    original resolves them (timestamps included: the resolver cache is copied)."""
    whole = OmegaConf.to_container(config, resolve=False)
    assert isinstance(whole, dict)
    overrides = (whole.get("hydra") or {}).get("overrides") or {}
    clean, _ = redact(whole, secrets=secrets)
    for kind in ("task", "hydra"):
        if kind in overrides:
            clean["hydra"]["overrides"][kind] = redact_overrides(overrides[kind], secrets)
    copy = OmegaConf.create(clean)
    OmegaConf.copy_cache(from_config=config, to_config=copy)
    assert isinstance(copy, DictConfig)
    return copy


def job_line(number: int, overrides: list[str], said: object, secrets: set[str]) -> str:
    """A sweep's line for job ``number``: ``#1 seed=1: run ...: resumed from step 30,
    trained to step 60``, its overrides redacted (``said``: what the job returned)."""
    shown = " ".join(redact_overrides(list(overrides), secrets))
    return mask(f"#{number} {shown}: {said or 'done'}", secrets)
