"""The side folder of GaLore / APOLLO (galore-torch, apollo-torch and the bitsandbytes both import), kept
off ``sys.path``: PEFT imports bitsandbytes whenever it is importable, which makes every ``import peft``
seconds slower (``bench/lowrank_import.py``). The folder is ``<venv>/lowrank-site`` (or
``$COCKPIT_LOWRANK_SITE``); :func:`install_command` fills it, and the ranks of a run whose config uses
``use_galore`` / ``use_apollo`` get it on their ``PYTHONPATH`` (:func:`rank_pythonpath`, called by
``strategy.launch.node_launch``); no other process has it. Stdlib only."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# the pins of scripts/constraints.txt (tests/test_lowrank.py holds them equal)
PACKAGES = ("galore-torch==1.0", "apollo-torch==1.0.3", "bitsandbytes==0.50.2")
# config key -> the module its optimizer imports
MODULES = {"use_galore": "galore_torch", "use_apollo": "apollo_torch"}


def folder(env: Mapping[str, str] | None = None) -> Path:
    """Where the side packages live: ``$COCKPIT_LOWRANK_SITE``, else ``lowrank-site`` in this venv."""
    env = os.environ if env is None else env
    return Path(env.get("COCKPIT_LOWRANK_SITE") or Path(sys.prefix) / "lowrank-site")


def install_command(env: Mapping[str, str] | None = None) -> str:
    """The one command that installs GaLore / APOLLO into the side folder (torch and transformers are
    Cockpit's own, hence --no-deps)."""
    return shlex.join([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(folder(env)), *PACKAGES])


def holds(module: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the side folder has ``module``."""
    site = folder(env)
    return site.is_dir() and importlib.machinery.PathFinder.find_spec(module, [str(site)]) is not None


def _on_path(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def needed_modules(cfg: Mapping[str, Any]) -> list[str]:
    """The side folder's modules the config's optimizer imports."""
    return [module for key, module in MODULES.items() if cfg.get(key)]


def rank_pythonpath(cfg: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str | None:
    """The ranks' ``PYTHONPATH`` (the side folder first, then ``env``'s) when the config needs a module that
    only the side folder has; None otherwise (a run that does not use GaLore / APOLLO never sees it)."""
    env = os.environ if env is None else env
    wanted = [m for m in needed_modules(cfg) if not _on_path(m)]
    if not wanted or not all(holds(m, env) for m in wanted):
        return None
    return os.pathsep.join(p for p in (str(folder(env)), env.get("PYTHONPATH", "")) if p)
