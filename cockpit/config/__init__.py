"""Run config: schema (``schema``) and loading / validation (``load``)."""

from cockpit.config.load import dump_resolved, load_config, parse_overrides, read_yaml, to_yaml, validate
from cockpit.config.schema import KEYS, SCHEMA, default_config

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
