"""``cockpit doctor``: is this machine ready to fine-tune? ROCm, torch, RCCL, DeepSpeed, bitsandbytes, NUMA.

Public API (no torch at import; torch is imported by the first check that needs it)::

    checks = run_checks(env=None, roots=None, gpu_smoke=False, needs=())
    blocking = blocking_failures(checks, tags)   # failures that stop a config with these tags

``env``: the environment the checks judge (default ``os.environ``); ``PATH`` in it is where
numactl, gcc, hipcc are looked for. ``roots``: a :class:`Roots` (or a mapping of its fields:
rocm, sys, proc, dev, runs_dir, cache_dir); the ROCm root defaults to ``$ROCM_PATH`` or
/opt/rocm. Torch itself always sees the real process environment. ``needs``: tags the
config requires; a missing optional piece (DeepSpeed, bitsandbytes, a compiler, a GPU
build of torch) is a skip/warn in general and a *fail* when it is needed. So the launch
code calls ``blocking_failures(run_checks(needs=tags), tags)``.

Tags (``matters_for``): gpu, rocm, cuda, multi_gpu, deepspeed, qlora, numa, build, telemetry
(see ``TAGS``). A failure blocks a config when its ``matters_for`` meets the config's tags, or
when ``matters_for`` is empty (python, disk, memory: every config).

JSON (``cockpit doctor --json``, schema version 1): a list, one object per check, in a fixed
order, every field always present::

    {"v": 1,
     "id": "rocm_arch",                 # stable identifier (see CHECK_IDS)
     "title": "PYTORCH_ROCM_ARCH",      # for display
     "status": "pass" | "warn" | "fail" | "skip",
     "seen": "...",                     # what the check found, one line
     "fix": "...",                      # "" when nothing to do; else one or two lines ("\\n")
     "matters_for": ["build", ...],     # sorted tags; [] = every config
     "data": {...}}                     # check-specific facts (JSON values), for the UI

Exit code of the command: 0 when no check fails, 1 when one does (2: bad arguments).
A check that crashes reports ``warn`` with ``data.crashed = true`` instead of stopping the rest.
"""

from __future__ import annotations

import functools
import os
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cockpit.doctor import comm, field, gpu, host, packages, rocm, smoke
from cockpit.doctor import needs as config_needs
from cockpit.doctor.facts import DeviceFacts, TorchFacts
from cockpit.doctor.model import FAIL, PASS, SCHEMA_VERSION, SKIP, STATUSES, TAGS, WARN, Check, Context, Roots

__all__ = [
    "CHECK_IDS",
    "FAIL",
    "PASS",
    "SCHEMA_VERSION",
    "SKIP",
    "STATUSES",
    "TAGS",
    "WARN",
    "Check",
    "DeviceFacts",
    "Roots",
    "TorchFacts",
    "blocking_failures",
    "run_checks",
]

CheckFn = Callable[[Context], Check]

CHECKS: tuple[tuple[str, CheckFn], ...] = (
    ("python", gpu.check_python),
    ("torch", gpu.check_torch),
    ("gpu_visible", gpu.check_gpu_visible),
    ("gpu_devices", gpu.check_gpu_devices),
    ("torch_arch", gpu.check_torch_arch),
    ("rocm_arch", gpu.check_rocm_arch),
    ("kfd", gpu.check_kfd),
    ("rocm_version", rocm.check_rocm_version),
    ("rocm_dev", rocm.check_rocm_dev),
    ("compilers", rocm.check_compilers),
    ("rccl", comm.check_rccl),
    ("comm_env", comm.check_comm_env),
    ("deepspeed", packages.check_deepspeed),
    ("bitsandbytes", packages.check_bitsandbytes),
    ("extras", packages.check_extras),
    ("telemetry", packages.check_telemetry),
    ("numactl", host.check_numactl),
    ("numa_balancing", host.check_numa_balancing),
    ("gpu_numa", host.check_gpu_numa),
    ("disk_runs", host.check_disk_runs),
    ("disk_cache", host.check_disk_cache),
    ("host_memory", host.check_host_memory),
    ("config", config_needs.check_config),
    *field.CHECKS,  # the ROCm field guide (docs/rocm.md), one check per item
)
CHECK_IDS: tuple[str, ...] = tuple(i for i, _ in CHECKS) + ("smoke",)


def _roots(env: Mapping[str, str], roots: Roots | Mapping[str, Any] | None) -> Roots:
    if isinstance(roots, Roots):
        return roots
    return Roots.from_env(env, **dict(roots or {}))


def _guarded(check_id: str, fn: Callable[[], Check]) -> Check:
    try:
        return fn()
    except Exception as exc:  # one broken check must not hide the others
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return Check(
            check_id,
            check_id,
            WARN,
            f"check crashed: {type(exc).__name__}: {exc} ({os.path.basename(where.filename)}:{where.lineno})",
            "please report this (cockpit doctor --json output)",
            data={"crashed": True},
        )


def run_checks(
    env: Mapping[str, str] | None = None,
    roots: Roots | Mapping[str, Any] | None = None,
    gpu_smoke: bool = False,
    *,
    needs: Iterable[str] = (),
    facts: TorchFacts | None = None,
    only: Iterable[str] | None = None,
    keys: Mapping[str, Any] | None = None,
) -> list[Check]:
    """Run every check (or the ``only`` ids), in ``CHECK_IDS`` order. Never raises.

    ``facts``: torch/device facts to use instead of importing torch (tests, or a caller that
    already gathered them in a rank). ``keys``: a config's schema keys (``cockpit doctor CONFIG``),
    which the config check and the field guide's config rules read.
    """
    env = dict(os.environ if env is None else env)
    ctx = Context(env, _roots(env, roots), needs=needs, facts=facts, keys=keys)
    wanted = set(only) if only is not None else None
    out = [_guarded(cid, functools.partial(fn, ctx)) for cid, fn in CHECKS if wanted is None or cid in wanted]
    if wanted is None or "smoke" in wanted:
        out.append(_guarded("smoke", lambda: smoke.check_smoke(ctx, gpu_smoke)))
    return out


def blocking_failures(checks: Iterable[Check | Mapping[str, Any]], tags: Iterable[str]) -> list[Check]:
    """The failed checks that stop a config with ``tags`` (empty ``matters_for``: every config).

    ``checks``: :class:`Check` objects, or the dicts of ``cockpit doctor --json``.
    """
    wanted = frozenset(tags)
    out = []
    for c in checks:
        check = c if isinstance(c, Check) else Check.from_dict(c)
        if check.status == FAIL and (not check.matters_for or check.matters_for & wanted):
            out.append(check)
    return out


def exit_code(checks: Iterable[Check]) -> int:
    return 1 if any(c.status == FAIL for c in checks) else 0


def summary(checks: Iterable[Check]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for c in checks:
        counts[c.status] += 1
    return counts
