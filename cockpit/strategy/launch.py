"""The launch of this node's ranks: the exact command and each rank's environment. No torch.

One process on one node: ``python -m cockpit.train.worker RUN_DIR``. Otherwise torchrun with
a c10d rendezvous (``--nproc_per_node --nnodes --node_rank --rdzv_endpoint``), DDP by default,
DeepSpeed / FSDP2 chosen inside the ranks from the config. With NUMA binding every rank is
started through :mod:`cockpit.strategy.bind` (torchrun ``--no-python``), which execs
``numactl --cpunodebind=N --preferred=N`` (``numa_memory: strict``: ``--membind``) in front of
the worker, keeping the pid.

The rendezvous id must be the same on every node while each node has its own run dir (and
run id): on several nodes it is derived from the rendezvous endpoint, which the nodes share.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cockpit.redact import redact_env
from cockpit.shape import RunShape
from cockpit.side_site import rank_pythonpath
from cockpit.slurm.script import SlurmConfig
from cockpit.strategy.numa import NumaPlan
from cockpit.strategy.numa import plan as numa_plan


class LaunchConfig(SlurmConfig, Protocol):
    """What the launch reads of a run's config (:class:`cockpit.config.run_config.RunConfig` has it):
    named here, so the strategies stay below the config package (they never import it, not even for
    a type); the Slurm script's part (processes, nodes, ``env``, ``use_cpu``, ``slurm_gres``) is
    :class:`cockpit.slurm.script.SlurmConfig`. The side folders' lookup reads its schema keys as a
    plain dict (``keys_only``)."""

    @property
    def node_rank(self) -> int: ...
    @property
    def master_addr(self) -> str: ...
    @property
    def master_port(self) -> int: ...
    @property
    def numa_bind(self) -> str: ...
    @property
    def numa_memory(self) -> str: ...
    @property
    def deepspeed(self) -> object: ...
    @property
    def zero_stage(self) -> int | None: ...
    @property
    def shape(self) -> RunShape: ...
    def keys_only(self) -> dict[str, Any]: ...


# set by the supervisor for every rank (cockpit/run/supervisor.py Supervisor.start)
SUPERVISOR_ENV = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now: a single node's torchrun rendezvous (``master_port``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def rdzv_id(cfg: LaunchConfig, run_id: str) -> str:
    if int(cfg.nnodes) > 1:
        addr = str(cfg.master_addr).replace(":", "_")
        return f"cockpit-{addr}-{int(cfg.master_port)}"
    return run_id


@dataclass
class LaunchPlan:
    command: list[str]
    env_add: dict[str, str]
    ranks: list[dict[str, Any]] = field(default_factory=list)
    numa: NumaPlan | None = None
    strategy: str = ""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "command": self.command,
            "env_add": self.env_add,
            "ranks": self.ranks,
            "numa": self.numa.as_dict() if self.numa else None,
            "notes": self.notes,
        }


def node_launch(
    run_path: str | os.PathLike[str],
    run_id: str,
    cfg: LaunchConfig,
    *,
    python: str = sys.executable,
    node_rank: int | None = None,
    sysfs: str = "/sys",
    env: Mapping[str, str] | None = None,
    numa: NumaPlan | None = None,
) -> LaunchPlan:
    """The command for one node (``node_rank``, default the config's) and its ranks' environment."""
    nproc, nnodes = int(cfg.nproc_per_node), int(cfg.nnodes)
    node_rank = int(cfg.node_rank) if node_rank is None else node_rank
    numa = (
        numa
        if numa is not None
        else numa_plan(cfg.numa_bind, nproc, sysfs=sysfs, env=env, memory=str(cfg.numa_memory or "preferred"))
    )
    worker = [python, "-m", "cockpit.train.worker", str(run_path)]
    notes = list(numa.notes)
    single = nproc == 1 and nnodes == 1
    port = int(cfg.master_port or 0) or 29500
    rank_argv = _bound(worker, numa, python, sysfs, single)
    command = rank_argv if single else _torchrun(cfg, run_id, python, node_rank, port, rank_argv, numa.active)
    env_add: dict[str, str] = {}
    if single and (cfg.deepspeed or cfg.zero_stage):
        # DeepSpeed without a launcher looks for MPI (mpi4py) to learn its rank; one process says it here
        env_add.update(
            {
                "RANK": "0",
                "LOCAL_RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        )
    side = rank_pythonpath(cfg.keys_only(), os.environ if env is None else env)
    if side:  # GaLore / APOLLO, QLoRA, trackers: their packages' side folders (off every other process's path)
        env_add["PYTHONPATH"] = side
    ranks = [
        {
            "rank": node_rank * nproc + local,
            "local_rank": local,
            "node_rank": node_rank,
            "numa_node": numa.nodes.get(local),
            "command": [*numa.prefix(local), *worker],
            "env": {**_rank_env(run_path, run_id, cfg, local, node_rank, env), **env_add},
        }
        for local in range(nproc)
    ]
    if nnodes > 1:
        notes.append("c10d assigns global ranks by the order nodes join; RANK above assumes node order")
        if str(cfg.master_addr) in ("127.0.0.1", "localhost"):
            notes.append("master_addr is loopback: the other nodes cannot reach it unless they are this machine")
    return LaunchPlan(
        command=command, env_add=env_add, ranks=ranks, numa=numa, strategy=cfg.shape.strategy, notes=notes
    )


def _bound(worker: list[str], numa: NumaPlan, python: str, sysfs: str, single: bool) -> list[str]:
    """The rank's command, behind the NUMA binding wrapper when binding is on."""
    if not numa.active:
        return worker
    wrap = [
        python,
        "-m",
        "cockpit.strategy.bind",
        f"--map={numa.map_text()}",
        f"--method={numa.method}",
        f"--memory={numa.memory}",
    ]
    if sysfs != "/sys":
        wrap.append(f"--sysfs={sysfs}")
    if single:
        wrap.append("--single")
    return [*wrap, "--", *worker]


def _torchrun(
    cfg: LaunchConfig, run_id: str, python: str, node_rank: int, port: int, rank_argv: list[str], bound: bool
) -> list[str]:
    """torchrun with the c10d rendezvous for this node's ranks."""
    command = [
        python,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={int(cfg.nproc_per_node)}",
        f"--nnodes={int(cfg.nnodes)}",
        f"--node_rank={node_rank}",
        "--rdzv_backend=c10d",
        f"--rdzv_endpoint={cfg.master_addr}:{port}",
        f"--rdzv_id={rdzv_id(cfg, run_id)}",
        "--max_restarts=0",
    ]
    # the binding wrapper is its own program; otherwise torchrun prepends its own python
    return [*command, "--no-python", *rank_argv] if bound else [*command, *rank_argv[1:]]


def _rank_env(
    run_path: str | os.PathLike[str],
    run_id: str,
    cfg: LaunchConfig,
    local: int,
    node_rank: int,
    env: Mapping[str, str] | None,
) -> dict[str, str]:
    """One rank's environment as launch.json shows it (the user's ``env`` with secrets redacted;
    under torchrun the variables torchrun sets)."""
    nproc, nnodes = int(cfg.nproc_per_node), int(cfg.nnodes)
    user_env = {k: str(v) for k, v in (cfg.env or {}).items()}
    rank_env: dict[str, str] = {**(redact_env(user_env) or {}), **SUPERVISOR_ENV, "COCKPIT_RUN_DIR": str(run_path)}
    if nproc == 1 and nnodes == 1:
        return rank_env
    rank_env.update(
        {
            "RANK": str(node_rank * nproc + local),
            "LOCAL_RANK": str(local),
            "GROUP_RANK": str(node_rank),
            "WORLD_SIZE": str(nproc * nnodes),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "(the rendezvous store, set by torchrun)",
            "MASTER_PORT": "(set by torchrun)",
            "TORCHELASTIC_RUN_ID": rdzv_id(cfg, run_id),
        }
    )
    if (
        nproc > 1
        and "OMP_NUM_THREADS" not in user_env
        and "OMP_NUM_THREADS" not in (os.environ if env is None else env)
    ):
        rank_env["OMP_NUM_THREADS"] = "1"
    return rank_env


def write_record(run_path: str | os.PathLike[str], launch: LaunchPlan, cfg: LaunchConfig) -> None:
    """``launch.json`` in the run dir: command, per-rank environment (secrets redacted), NUMA plan."""
    import json

    from cockpit.store.rundir import atomic_write_json

    data = launch.as_dict()
    data["env"] = redact_env({k: str(v) for k, v in (cfg.env or {}).items()}) or {}
    try:
        atomic_write_json(Path(run_path) / "launch.json", json.loads(json.dumps(data, default=str)))
    except OSError:
        pass
