"""Building a schema's dataclass from a composed config node (needs OmegaConf)."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, fields
from typing import Any, TypeVar

from recovery.config.checks import did_you_mean
from recovery.errors import ConfigError

T = TypeVar("T")


def _example(schema: type, path: str) -> str:
    """``; set e.g. <key>=<default>`` for the field at dotted ``path`` of ``schema``, or ``""``."""
    value: Any = schema
    for name in path.split("."):
        if not dataclasses.is_dataclass(value):
            return ""
        found = {f.name: f for f in fields(value)}.get(name)
        if found is None:
            return ""
        if found.default is not MISSING:
            value = found.default
        elif found.default_factory is not MISSING:
            value = found.default_factory()
        else:
            return ""
        value = type(value) if dataclasses.is_dataclass(value) else value
    if dataclasses.is_dataclass(value) or value is None:
        return ""
    shown = str(value).lower() if isinstance(value, bool) else value
    return f"; set e.g. {{key}}={shown}"


def typed(schema: type[T], node: Any, *, key: str) -> T:
    """Validate ``node`` (a config node or dict) against ``schema`` and build it.

    Args:
        schema: a dataclass type.
        node: the composed config node for it.
        key: its dotted key, for messages.

    Raises:
        ConfigError: naming the key, the bad value and the reason.
    """
    # OmegaConf comes with the [hydra] extra; the core (own loops) builds the dataclasses itself
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

    aliases: dict[str, str] = getattr(schema, "ALIASES", {})
    if node is not None and not isinstance(node, dict):
        try:  # resolve interpolations while the node still knows its parents
            node = OmegaConf.to_container(node, resolve=True)
        except OmegaConfBaseException as err:
            raise ConfigError(f"{key}: {str(err).splitlines()[0]}") from err
    if aliases and isinstance(node, dict):
        node = {aliases.get(str(k), str(k)): v for k, v in node.items()}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node if node is not None else {})
        obj = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        cause = err.__cause__ if isinstance(err.__cause__, ConfigError) else None
        if cause is not None:
            raise cause from None
        path = str(err.full_key or err.key or "")
        named = {v: k for k, v in aliases.items()}.get(path, path)  # as the user spelt it
        where = f"{key}.{named}" if path else key
        hint = _example(schema, path).format(key=where) if path else ""
        if isinstance(err, ConfigKeyError) and err.key is not None:
            names = [f.name for f in fields(schema)] + list(aliases)  # type: ignore[arg-type]
            hint = did_you_mean(str(err.key), names, prefix=key) or f"; {key} has {names}"
        raise ConfigError(f"{where}: {str(err).splitlines()[0]}{hint}") from err
    if not isinstance(obj, schema):
        raise ConfigError(
            f"{key}: expected a {schema.__name__} mapping, found {type(obj).__name__}"
        )
    return obj
