"""The shape of a run, derived once from a validated config: how many processes on how many
nodes, in which precision, under which strategy, and whether its parameters are sharded.

Pure (stdlib only), below ``config`` and ``strategy``, so the validator, the launcher, the
supervisor, the planner, ``cockpit preview`` and the ranks read one answer instead of each
multiplying ``nproc_per_node`` by ``nnodes`` or re-deciding the precision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PRECISIONS = ("bf16", "fp16", "fp32")


@dataclass(frozen=True)
class RunShape:
    nproc_per_node: int
    nnodes: int
    node_rank: int
    precision: str  # one of PRECISIONS
    strategy: str  # "single process", "DDP", "deepspeed ZeRO-3 + offload optimizer", "FSDP2 (full_shard)", ...
    zero_stage: int | None  # a generated DeepSpeed config's stage (None: a user file or no DeepSpeed)
    sharded: bool  # parameters split over ranks at load: ZeRO-3 (generated) or FSDP

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def multi_process(self) -> bool:
        return self.world_size > 1


def precision_of(cfg: Mapping[str, Any]) -> str:
    return "bf16" if cfg.get("bf16") else ("fp16" if cfg.get("fp16") else "fp32")


def world_size_of(cfg: Mapping[str, Any]) -> int:
    return int(cfg.get("nproc_per_node") or 1) * int(cfg.get("nnodes") or 1)


def strategy_of(cfg: Mapping[str, Any]) -> str:
    if cfg.get("deepspeed"):
        return "deepspeed (user config)"
    if cfg.get("zero_stage"):
        off = cfg.get("offload") or "none"
        return f"deepspeed ZeRO-{cfg['zero_stage']}" + (f" + offload {off}" if off != "none" else "")
    if cfg.get("fsdp"):
        return f"FSDP2 ({cfg['fsdp']})"
    return "DDP" if world_size_of(cfg) > 1 else "single process"


def shape_of(cfg: Mapping[str, Any]) -> RunShape:
    zero = int(cfg["zero_stage"]) if cfg.get("zero_stage") and not cfg.get("deepspeed") else None
    return RunShape(
        nproc_per_node=int(cfg.get("nproc_per_node") or 1),
        nnodes=int(cfg.get("nnodes") or 1),
        node_rank=int(cfg.get("node_rank") or 0),
        precision=precision_of(cfg),
        strategy=strategy_of(cfg),
        zero_stage=zero,
        sharded=bool(cfg.get("fsdp")) or zero == 3,
    )
