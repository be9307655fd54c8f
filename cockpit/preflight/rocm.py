"""``cockpit check``'s share of the ROCm field guide (docs/rocm.md): the config rules of
:mod:`cockpit.doctor.field`, asked of this machine before any run dir exists.

The facts are cheap (no torch import): the torch build from ``torch/version.py``'s text, the GPUs' gfx
targets from KFD's sysfs topology, bitsandbytes' version from its metadata, the environment the ranks
get (this process's, with the config's ``env`` over it). A config that trains on the CPU
(``use_cpu: true``) or a machine without a GPU build of torch meets none of them.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cockpit.doctor import field as guide
from cockpit.errors import Problem

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


@dataclass(frozen=True)
class Facts:
    build: str  # "rocm" | "cuda" | "cpu" | "none"
    targets: list[str] = field(default_factory=list)
    bnb_version: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    flash_attn: bool = False


def torch_build() -> str:
    """The installed torch's build, read from ``torch/version.py`` (``hip = '6.3...'`` on ROCm)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return "none"
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return "none"
    for name in ("hip", "cuda"):
        if re.search(rf"^{name}\s*(?::[^=]*)?=\s*['\"]", text, re.M):
            return "rocm" if name == "hip" else "cuda"
    return "cpu"


def facts_here(cfg: RunConfig, sys_root: Path = Path("/sys")) -> Facts:
    from cockpit import side_site

    env = {**os.environ, **{k: str(v) for k, v in (cfg.env or {}).items()}}
    found = side_site.installed_at("bitsandbytes", env) if cfg.quantization_bit == 4 else None
    return Facts(
        build=torch_build(),
        targets=guide.kfd_targets(sys_root),
        bnb_version=found[0] if found else None,
        env=env,
        flash_attn=importlib.util.find_spec("flash_attn") is not None,
    )


def field_problems(cfg: RunConfig, facts: Facts | None = None) -> list[Problem]:
    """What the field guide refuses in ``cfg`` on this machine (``facts``: the machine's, by default)."""
    if cfg.use_cpu is True:
        return []
    facts = facts or facts_here(cfg)
    if facts.build not in ("rocm", "cuda"):
        return []
    env_keys = set((cfg.env or {}).keys())
    problems: list[Problem] = []
    if (found := guide.alloc_conf_problem(facts.env)) is not None:
        problems.append(Problem(guide.alloc_conf_message(*found), key="env" if found[0] in env_keys else None))
    if facts.build != "rocm":
        return problems
    return problems + _rocm_problems(cfg, facts, env_keys)


def _rocm_problems(cfg: RunConfig, facts: Facts, env_keys: set[str]) -> list[Problem]:
    from cockpit.doctor.packages import BNB_GOOD_ROCM

    out: list[Problem] = []
    if (masks := guide.device_masks_problem(facts.env)) is not None:
        key = "env" if env_keys & set(guide.MASK_VARS) else None
        out.append(Problem(guide.device_masks_message(*masks), key=key))
    if cfg.quantization_bit == 4 and (
        reason := guide.qlora_cdna_problem(facts.targets, facts.bnb_version, BNB_GOOD_ROCM)
    ):
        out.append(Problem(reason, key="quantization_bit"))
    if cfg.torch_compile and (reason := guide.compile_mode_problem(facts.env, cfg.torch_compile_mode)):
        key = "torch_compile_mode" if cfg.torch_compile_mode in guide.CUDAGRAPH_MODES else "torch_compile"
        out.append(Problem(reason, key=key))
    if reason := guide.vllm_colocate_problem(cfg.stage, cfg.use_vllm, cfg.vllm_mode):
        out.append(Problem(reason, key="vllm_mode"))
    if cfg.flash_attn == "fa2" and facts.flash_attn and (reason := guide.fa2_problem(facts.targets, facts.env)):
        out.append(Problem(reason, key="flash_attn"))
    return out
