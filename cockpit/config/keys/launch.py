"""Cockpit's own launch keys: DeepSpeed / FSDP, ranks and nodes, env, Slurm, NUMA.

Each key once: type, default, help, range or choices, and whether LLaMA-Factory has it
(``llamafactory``); :mod:`cockpit.config.schema` joins the groups."""

from __future__ import annotations

from cockpit.config.keys.base import Key, _k

KEYS: tuple[Key, ...] = (
    _k("deepspeed", "str", None, "a DeepSpeed JSON config", "strategy"),
    _k("fsdp", "str", None, "FSDP options, e.g. 'full_shard auto_wrap'", "strategy"),
    _k(
        "nproc_per_node",
        "int",
        1,
        "processes (GPUs) per node",
        "strategy",
        min=1,
        max=1024,
        nullable=False,
        llamafactory=False,
    ),
    _k("nnodes", "int", 1, "nodes", "strategy", min=1, max=100000, nullable=False, llamafactory=False),
    _k("node_rank", "int", 0, "this node's rank", "strategy", min=0, nullable=False, llamafactory=False),
    _k("master_addr", "str", "127.0.0.1", "rendezvous address", "strategy", nullable=False, llamafactory=False),
    _k(
        "master_port",
        "int",
        0,
        "rendezvous port (0: pick a free one)",
        "strategy",
        min=0,
        max=65535,
        nullable=False,
        llamafactory=False,
    ),
    _k("env", "map", None, "environment variables applied to every rank", "strategy", llamafactory=False),
    _k(
        "zero_stage",
        "choice",
        None,
        "generate a DeepSpeed ZeRO config (2 | 3; written to the run dir as ds_config.json)",
        "strategy",
        choices=(2, 3),
        llamafactory=False,
    ),
    _k(
        "offload",
        "choice",
        "none",
        "DeepSpeed offload to the CPU: none | optimizer | optimizer+params (params: ZeRO-3)",
        "strategy",
        choices=("none", "optimizer", "optimizer+params"),
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "slurm_gres",
        "str",
        None,
        "Slurm: the cluster's GPU GRES name, e.g. 'gpu:mi300x' (--gres=NAME:N per node; unset: --gpus-per-node=N)",
        "strategy",
        llamafactory=False,
    ),
    _k(
        "numa_memory",
        "choice",
        "preferred",
        "with NUMA binding, each rank's memory: preferred (its node first, spills over) | strict (numactl --membind: "
        "only its node; an offload run can be OOM-killed while the other node has room)",
        "strategy",
        choices=("preferred", "strict"),
        nullable=False,
        llamafactory=False,
    ),
    _k(
        "numa_bind",
        "str",
        "auto",
        "bind each local rank's CPUs and memory: auto (its GPU's NUMA node) | off | a map like '0:0,1:0,2:1'",
        "strategy",
        nullable=False,
        llamafactory=False,
    ),
)
