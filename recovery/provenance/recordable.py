"""An own loop's config as the checkpoint records it (``config.yaml``, the config digest).

``Checkpointer(config=...)`` takes what own loops have: a dict, an ``argparse``
``Namespace`` (or any object with attributes, such as a dataclass instance), with
``Path`` values, tuples and nested dicts. :func:`recordable` turns it into plain YAML
values; a value it cannot record faithfully is refused by its key, never written as
an opaque object or dropped. Without a config the command line is recorded
(``{"argv": [...]}``), so a resume with other arguments shows as config drift
(``DRIFT since step-...: ...``), as a changed override does in ``train.py``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from os import PathLike
from typing import Any

from recovery.errors import ConfigError

_SCALARS = (bool, int, float, str, type(None))


def _value(value: Any, key: str) -> Any:
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, PathLike):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): _value(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_value(v, f"{key}[{i}]") for i, v in enumerate(value)]
    raise ConfigError(
        f"Checkpointer config=: {key} is a {type(value).__name__}, which cannot be recorded "
        "in config.yaml; pass str, numbers, bools, paths, lists or dicts of them (or leave "
        "the key out)"
    )


def recordable(config: object | None) -> dict[str, Any]:
    """``config`` as plain YAML values, keys in their order; ``None``: the command line.

    Raises:
        ConfigError: a value that cannot be recorded, named by its dotted key.
    """
    if config is None:
        return {"argv": list(sys.argv[1:])}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    elif not isinstance(config, Mapping):
        if not hasattr(config, "__dict__"):
            raise ConfigError(
                f"Checkpointer config=: expected a dict or an argparse Namespace, found "
                f"{type(config).__name__}"
            )
        config = vars(config)
    return {str(k): _value(v, str(k)) for k, v in config.items()}
