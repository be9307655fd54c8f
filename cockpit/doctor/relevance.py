"""Which doctor results matter for a config (pure: no torch, no I/O).

    tags = config_tags(keys)                    # {"deepspeed", "multi_gpu", ...} (see doctor.TAGS)
    stop = blocking_for_config(checks, keys)    # the checks that should stop this config's launch

``keys``: the run's schema keys as a flat mapping (a ``RunConfig.keys_only()``: the doctor sits below
``cockpit.config``).
``checks``: :class:`Check` objects or the dicts of ``cockpit doctor --json``. A failure blocks
as :func:`cockpit.doctor.blocking_failures` says (its ``matters_for`` meets the tags, or is
empty). Checks run without ``--needs`` report a missing optional piece as skip/warn; for the
pieces a config cannot run without (DeepSpeed for ZeRO, bitsandbytes for QLoRA, numactl for an
explicit ``numa_bind`` map) such a result blocks too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cockpit.doctor.model import SKIP, WARN, Check

# check id -> (the tag that makes it required, the statuses that then block besides fail):
# skip = not installed / no GPU build; numactl missing or broken is a warn
REQUIRED = {"deepspeed": ("deepspeed", {SKIP}), "bitsandbytes": ("qlora", {SKIP}), "numactl": ("numa", {SKIP, WARN})}


def _true(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes", "on")


def config_tags(keys: Mapping[str, Any]) -> set[str]:
    """The doctor tags a config needs. GPU or not is :func:`cockpit.device.needs_gpu`, the
    decision the preflight and the ranks make too (``use_cpu: false``, which every GPU preset
    sets, or 4/8-bit base weights with ``use_cpu`` unset)."""
    from cockpit.device import needs_gpu

    quant = keys.get("quantization_bit") not in (None, "")
    gpu = needs_gpu(keys.get("use_cpu"), keys.get("quantization_bit"))
    tags: set[str] = set()
    if gpu:
        tags |= {"gpu", "rocm", "cuda"}  # the rocm/cuda checks only fail on their own build
    world = int(keys.get("nproc_per_node") or 1) * int(keys.get("nnodes") or 1)
    if gpu and world > 1:
        tags.add("multi_gpu")
    if keys.get("zero_stage") or keys.get("deepspeed"):
        tags.add("deepspeed")
    if quant:
        tags.add("qlora")
    numa = str(keys.get("numa_bind") or "auto").strip().lower()
    if numa not in ("auto", "off", "false", "none", ""):
        tags.add("numa")
    return tags


# the doctor's checks that say why torch sees no GPU (``cockpit check`` adds the blocking ones to its refusal)
GPU_CHECK_IDS = ("torch", "gpu_visible", "gpu_devices", "torch_arch", "kfd", "rocm_version")


def no_gpu_reasons(checks: Iterable[Check | Mapping[str, Any]], keys: Mapping[str, Any]) -> list[str]:
    """Why no GPU is usable for ``keys``: a line per GPU check that blocks it, from the doctor's answer for
    the config's needs (``config_tags``). ``cockpit check`` (the preflight) and Setup's problems pane (the
    doctor's JSON from a subprocess) add them to the gate's refusal (:func:`cockpit.device.device_problems`)."""
    gpu = [c for c in checks if (c.id if isinstance(c, Check) else c.get("id")) in GPU_CHECK_IDS]
    return [
        f"{c.title}: {c.seen}" + (f" (fix: {c.fix.splitlines()[0]})" if c.fix else "")
        for c in blocking_for_config(gpu, keys)
    ]


def blocking_for_config(checks: Iterable[Check | Mapping[str, Any]], keys: Mapping[str, Any]) -> list[Check]:
    """The checks that stop a launch of ``keys``, in the doctor's order."""
    from cockpit.doctor import blocking_failures

    tags = config_tags(keys)
    parsed = [c if isinstance(c, Check) else Check.from_dict(c) for c in checks]
    failing = {id(c) for c in blocking_failures(parsed, tags)}
    return [
        c
        for c in parsed
        if id(c) in failing or (c.id in REQUIRED and REQUIRED[c.id][0] in tags and c.status in REQUIRED[c.id][1])
    ]
