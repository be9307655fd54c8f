"""Several nodes: the command for each node, a Slurm ``sbatch`` script and a DeepSpeed hostfile.

Every node runs ``cockpit train CONFIG --set node_rank=K`` (its own supervisor and run dir);
their torchrun agents meet at the c10d rendezvous ``master_addr:master_port`` under the same
rendezvous id (:func:`cockpit.strategy.launch.rdzv_id`). No torch.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cockpit.strategy.launch import LaunchConfig


def _set_args(overrides: Sequence[str], **extra: Any) -> list[str]:
    keep = [o for o in overrides if o.partition("=")[0].strip() not in extra]
    return [a for o in [*keep, *(f"{k}={v}" for k, v in extra.items())] for a in ("--set", o)]


def node_commands(config_path: str, overrides: Sequence[str], cfg: LaunchConfig) -> list[dict[str, Any]]:
    """One ``cockpit train`` line per node (node 0 first)."""
    out = []
    for k in range(int(cfg.nnodes)):
        argv = [
            "cockpit",
            "train",
            config_path,
            *_set_args(overrides, node_rank=k, master_addr=cfg.master_addr, master_port=int(cfg.master_port or 0)),
        ]
        out.append({"node_rank": k, "argv": argv, "shell": shlex.join(argv)})
    return out


def sbatch_script(
    config_path: str,
    overrides: Sequence[str],
    cfg: LaunchConfig,
    *,
    job_name: str = "cockpit",
    cpus_per_task: int | None = None,
    time_limit: str | None = None,
    has_gpus: bool | None = None,
) -> str:
    """A Slurm batch script: one task per node, each runs this node's ``cockpit train``.
    GPUs are requested only when the config needs them (:mod:`cockpit.slurm.script`)."""
    from cockpit.slurm.script import SlurmOptions, train_script

    port = int(cfg.master_port or 0) or 29500
    opts = SlurmOptions(time=time_limit, cpus_per_task=cpus_per_task)
    return train_script(
        config_path, _set_args(overrides, master_port=port), cfg, opts, job_name=job_name, has_gpus=has_gpus
    )


def hostfile(cfg: LaunchConfig, hosts: Sequence[str] | None = None) -> str:
    """A DeepSpeed hostfile (``host slots=N``); placeholder names when no hosts are given."""
    nnodes, nproc = int(cfg.nnodes), int(cfg.nproc_per_node)
    names = list(hosts or [])
    lines = []
    if len(names) < nnodes:
        lines.append(f"# replace the node names: {nnodes} nodes, {nproc} slots (GPUs) each")
        names += [f"node{i}" for i in range(len(names), nnodes)]
    lines += [f"{h} slots={nproc}" for h in names[:nnodes]]
    return "\n".join(lines) + "\n"
