"""Run config: schema (``schema``) and loading / validation (``load``).

The names below are loaded on first use (PEP 562): ``cockpit.config.schema`` alone (the Setup
screen's field list) does not import ``load`` (YAML, the run config, the stage rules), which the
cockpit's first frame would otherwise wait for."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cockpit.config.load import dump_resolved, load_config, parse_overrides, read_yaml, to_yaml, validate
    from cockpit.config.schema import KEYS, SCHEMA, default_config

_FROM = {
    **dict.fromkeys(("dump_resolved", "load_config", "parse_overrides", "read_yaml", "to_yaml", "validate"), "load"),
    **dict.fromkeys(("KEYS", "SCHEMA", "default_config"), "schema"),
}

__all__ = [
    "KEYS",
    "SCHEMA",
    "default_config",
    "dump_resolved",
    "load_config",
    "parse_overrides",
    "read_yaml",
    "to_yaml",
    "validate",
]


def __getattr__(name: str) -> Any:
    if name in _FROM:
        return getattr(importlib.import_module(f"cockpit.config.{_FROM[name]}"), name)
    raise AttributeError(f"module 'cockpit.config' has no attribute {name!r}")
