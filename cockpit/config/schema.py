"""The run config schema: one flat mapping, LLaMA-Factory's key names for the common subset.

Each key has a type, a default, and either choices or a range. ``cockpit check``, the TUI's
forms and ``cockpit train`` all validate through :func:`cockpit.config.load.validate`.
No torch / transformers imports here (the UI uses this module).
"""

from __future__ import annotations

from typing import Any

from cockpit.config.keys import KEYS
from cockpit.config.keys.base import OPTIMIZERS, REPORT_TO_HELP, SCHEDULERS, TRACKER_NAMES, Key
from cockpit.config.keys.refused import REFUSED_NAMES

__all__ = [
    "ADAPTER_METHODS",
    "ALIASES",
    "KEYS",
    "LLAMAFACTORY_UNSUPPORTED",
    "OPTIMIZERS",
    "REPORT_TO_HELP",
    "SCHEDULERS",
    "SCHEMA",
    "TRACKER_NAMES",
    "Key",
    "default_config",
    "describe",
]

SCHEMA: dict[str, Key] = {k.name: k for k in KEYS}

# finetuning_type values that train a PEFT adapter over a frozen base (saved as adapter/, merged by export)
ADAPTER_METHODS = ("lora", "oft")

# Other spellings LLaMA-Factory users meet in guides -> the schema key they mean (said once in the log).
ALIASES: dict[str, str] = {"lora_target_modules": "lora_target", "new_special_tokens": "add_special_tokens"}

# LLaMA-Factory keys we know but do not implement yet: an error says so, never silently ignored.
LLAMAFACTORY_UNSUPPORTED = REFUSED_NAMES - (
    {k.name for k in KEYS} | set(ALIASES)
)  # a key the schema (or an alias) has now is no longer refused


def default_config() -> dict[str, Any]:
    return {k.name: k.default for k in KEYS}


def _bound(value: float) -> str:
    """A schema bound in words: whole numbers whole (1048576, not 1.04858e+06)."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def describe(key: Key) -> str:
    """The allowed values of a key, for error messages."""
    if key.choices and key.type == "names":
        allowed = "one or a list of " + " | ".join(str(c) for c in key.choices)
    elif key.choices:
        allowed = " | ".join(str(c) for c in key.choices)
    elif key.type in ("int", "float"):
        lo = "" if key.min is None else (f"> {_bound(key.min)}" if key.min_exclusive else f">= {_bound(key.min)}")
        hi = "" if key.max is None else f"<= {_bound(key.max)}"
        allowed = f"{key.type} " + " and ".join(x for x in (lo, hi) if x) if (lo or hi) else key.type
    elif key.type == "bool":
        allowed = "true | false"
    elif key.type == "map":
        allowed = "a mapping of NAME: value"
    elif key.type == "dict":
        allowed = "a mapping"
    else:
        allowed = "a string"
    if key.nullable and key.default is None:
        allowed += " (or null)"
    return allowed
