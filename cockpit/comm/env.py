"""The communication environment in effect: the NCCL/RCCL/HSA/torch-NCCL variables a run sees.

    from cockpit.comm.env import comm_env
    comm_env(os.environ)   # -> {"NCCL_DEBUG": "INFO", ..., "HSA_FORCE_FINE_GRAIN_PCIE": "1"}

Only variables that are set are returned: first the well-known ones in :data:`KEY_VARS` order
(the ones people ask about when a run hangs or is slow), then every other ``NCCL_*``,
``RCCL_*``, ``HSA_*`` and ``TORCH_NCCL_*`` variable, sorted. No torch, no textual.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

KEY_VARS = (
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_SOCKET_IFNAME",
    "NCCL_IB_HCA",
    "NCCL_MIN_NCHANNELS",
    "NCCL_NET_PLUGIN",
    "RCCL_NET_PLUGIN",
    "HSA_FORCE_FINE_GRAIN_PCIE",
    "TORCH_NCCL_HIGH_PRIORITY",
    "GPU_MAX_HW_QUEUES",
    "RCCL_MSCCL_FORCE_ENABLE",
)
PREFIXES = ("NCCL_", "RCCL_", "HSA_", "TORCH_NCCL_")


def comm_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    env = os.environ if env is None else env
    out = {name: env[name] for name in KEY_VARS if name in env}
    for name in sorted(env):
        if name not in out and name.startswith(PREFIXES):
            out[name] = env[name]
    return out


def missing_key_vars(env: Mapping[str, str] | None = None) -> list[str]:
    """The well-known variables that are not set (shown as "default" in the UI)."""
    env = os.environ if env is None else env
    return [name for name in KEY_VARS if name not in env]
