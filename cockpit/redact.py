"""Secret redaction: which names hold secrets, and the marker written in their place.

Used wherever a config or an environment is written down (the run dir's config.yaml and
launch.json, multi-node scripts and sbatch files). A module of its own, below both
``cockpit.config`` and ``cockpit.strategy``, so neither has to import the other for it.
Pure Python, standard library only.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

SECRET_PATTERNS = ("*TOKEN*", "*KEY*", "*SECRET*", "*PASS*", "*CREDENTIAL*", "*AUTH*")
REDACTED = "***redacted***"


def is_secret_name(name: str) -> bool:
    upper = name.upper()
    return any(fnmatch.fnmatchcase(upper, pat) for pat in SECRET_PATTERNS)


def secret_values(env: Mapping[str, Any] | None) -> dict[str, str]:
    """The secrets of ``env`` (name -> value), not already redacted: what a written-down config
    leaves out, passed to the command that needs them through its environment instead."""
    return {k: str(v) for k, v in (env or {}).items() if is_secret_name(k) and v != REDACTED}


def unredacted(env: Mapping[str, Any] | None) -> dict[str, str]:
    """``env`` less its redacted entries: a process started with it keeps the secret values it
    inherited (from the command that started it) instead of the marker."""
    return {k: str(v) for k, v in (env or {}).items() if v != REDACTED}


def redact_env(env: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if env is None:
        return None
    return {k: (REDACTED if is_secret_name(k) else v) for k, v in env.items()}
