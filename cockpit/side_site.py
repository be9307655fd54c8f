"""The side folders of the optional packages the README's install (``scripts/bootstrap.sh``) puts off
``sys.path``: ``<venv>/lowrank-site`` (GaLore, APOLLO and bitsandbytes: PEFT imports bitsandbytes whenever it
is importable, which makes every ``import peft`` seconds slower, ``bench/lowrank_import.py``) and
``<venv>/trackers-site`` (the experiment trackers: wandb importable makes every TRL trainer import it).
``$COCKPIT_LOWRANK_SITE`` / ``$COCKPIT_TRACKERS_SITE`` name other folders.

No process has a side folder on its path but the ranks of a run whose keys need one of its packages
(:func:`needed_modules`: ``use_galore`` / ``use_apollo``, ``quantization_bit`` / ``ref_model_quantization_bit``
and bitsandbytes' optimizers, ``report_to`` / ``use_swanlab``), which get it on their ``PYTHONPATH``
(:func:`rank_pythonpath`, called by ``strategy.launch.node_launch``). Whether a package is installed is
:func:`available`: on ``sys.path`` (a ``pip install 'cockpit-tune[qlora]'`` into the venv) or in its side
folder, one answer for ``cockpit check``, the ranks' path and ``cockpit doctor``. Stdlib only."""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
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
# optim name prefix -> the module HF's optimizer of that name imports (in the side folder too)
OPTIM_PREFIXES = {"galore_": "galore_torch", "apollo_": "apollo_torch"}
# report_to name -> the module the tracker's HF callback imports (one pip extra installs them: trackers)
TRACKER_MODULES = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "trackio": "trackio",
    "swanlab": "swanlab",
}
# HF optimizer names that are bitsandbytes' (the prefixes of cockpit.config.parity's table)
BNB_OPTIMS = ("paged_", "lion_", "rmsprop_bnb", "ademamix", "adamw_bnb_8bit", "adamw_8bit")
# side folder -> (the variable naming another folder, the folder's name in the venv)
SITES = {"lowrank": ("COCKPIT_LOWRANK_SITE", "lowrank-site"), "trackers": ("COCKPIT_TRACKERS_SITE", "trackers-site")}
# module -> the side folder scripts/bootstrap.sh installs it in
SITE_OF = {"galore_torch": "lowrank", "apollo_torch": "lowrank", "bitsandbytes": "lowrank"} | {
    m: "trackers" for m in TRACKER_MODULES.values()
}
# module -> its distribution's name (for versions)
DISTRIBUTIONS = {"galore_torch": "galore-torch", "apollo_torch": "apollo-torch", "mlflow": "mlflow-skinny"}


def folder(env: Mapping[str, str] | None = None, site: str = "lowrank") -> Path:
    """Where a side folder's packages live: its variable (``$COCKPIT_LOWRANK_SITE``), else
    ``lowrank-site`` / ``trackers-site`` in this venv."""
    env = os.environ if env is None else env
    variable, name = SITES[site]
    return Path(env.get(variable) or Path(sys.prefix) / name)


def install_command(env: Mapping[str, str] | None = None) -> str:
    """The one command that installs GaLore / APOLLO / bitsandbytes into the side folder (torch and
    transformers are Cockpit's own, hence --no-deps)."""
    return shlex.join([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(folder(env)), *PACKAGES])


def trackers(report_to: str | None, use_swanlab: Any) -> list[str]:
    """The trackers a config with these keys logs to, in ``report_to``'s order (``use_swanlab`` adds
    swanlab, as in LLaMA-Factory, once)."""
    names = [n for n in str(report_to or "none").split(",") if n and n != "none"]
    if use_swanlab and "swanlab" not in names:
        names.append("swanlab")
    return names


def side_spec(module: str, env: Mapping[str, str] | None = None) -> importlib.machinery.ModuleSpec | None:
    """``module``'s spec in its side folder, None when the folder lacks it."""
    site = folder(env, SITE_OF.get(module, "lowrank"))
    if not site.is_dir():
        return None
    return importlib.machinery.PathFinder.find_spec(module, [str(site)])


def holds(module: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether ``module``'s side folder has it."""
    return side_spec(module, env) is not None


def _on_path(module: str) -> importlib.machinery.ModuleSpec | None:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def find(module: str, env: Mapping[str, str] | None = None) -> tuple[importlib.machinery.ModuleSpec, bool] | None:
    """``module``'s spec and whether it is the side folder's (False: on ``sys.path``, which wins, as on a
    rank's path), None when neither has it."""
    spec = _on_path(module)
    if spec is not None:
        return spec, False
    spec = side_spec(module, env)
    return (spec, True) if spec is not None else None


def available(module: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether a run can import ``module``: on this process's ``sys.path`` or in its side folder (which
    the ranks of a run that needs it get, :func:`rank_pythonpath`)."""
    return find(module, env) is not None


def installed_at(module: str, env: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """(version, the folder it is in) of an available ``module``, None when it is not."""
    found = find(module, env)
    if found is None:
        return None
    spec, _side = found
    origin = Path(spec.origin or next(iter(spec.submodule_search_locations or []), ""))
    where = origin.parent.parent if origin.name == "__init__.py" else origin.parent
    dist = DISTRIBUTIONS.get(module, module)
    try:
        version = next(iter(importlib.metadata.distributions(name=dist, path=[str(where)]))).version
    except StopIteration:
        version = "?"
    return version, str(where)


def needed_modules(keys: Mapping[str, Any]) -> list[str]:
    """The side folders' modules a config's keys import in its ranks: GaLore / APOLLO's optimizers,
    bitsandbytes for 4/8-bit weights (the policy's and the reference model's) and its optimizers, the
    trackers of ``report_to`` / ``use_swanlab``. ``keys``: the run's schema keys as a flat mapping (a
    ``RunConfig.keys_only()``; this module sits below ``cockpit.config``)."""
    out = [module for key, module in MODULES.items() if keys.get(key)]
    optim = str(keys.get("optim") or "")
    # HF's own optimizer names for them (optim: galore_adamw, apollo_adamw_layerwise, ...) import them too
    out += [module for prefix, module in OPTIM_PREFIXES.items() if optim.startswith(prefix) and module not in out]
    if keys.get("quantization_bit") or keys.get("ref_model_quantization_bit") or optim.startswith(BNB_OPTIMS):
        out.append("bitsandbytes")
    on = trackers(keys.get("report_to"), keys.get("use_swanlab"))
    out += [TRACKER_MODULES[n] for n in on if n in TRACKER_MODULES]
    return out


def rank_pythonpath(keys: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str | None:
    """The ranks' ``PYTHONPATH``: the side folders that hold what the config needs and ``sys.path`` lacks
    first, then ``env``'s; None when there is none (a run whose keys need no side package never sees
    one; a package missing everywhere is ``cockpit check``'s refusal, not the path's)."""
    env = os.environ if env is None else env
    sites: list[str] = []
    for module in needed_modules(keys):
        if _on_path(module) is None and holds(module, env):
            site = str(folder(env, SITE_OF[module]))
            if site not in sites:
                sites.append(site)
    if not sites:
        return None
    return os.pathsep.join(p for p in (*sites, env.get("PYTHONPATH", "")) if p)
