"""The shape of a run, derived once from a validated config: how many processes on how many
nodes, in which precision, under which strategy, and whether its parameters are sharded.

Pure (stdlib only), below ``config`` and ``strategy``, so the validator, the launcher, the
supervisor, the planner, ``cockpit preview`` and the ranks read one answer instead of each
multiplying ``nproc_per_node`` by ``nnodes`` or re-deciding the precision. ``raw`` is the flat mapping of
schema keys: the loader's dict before a ``RunConfig`` exists, or the ``RunConfig`` itself (``RunConfig.shape``);
everyone else reads ``cfg.shape`` / ``cfg.world_size`` / ``cfg.precision``.
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


def precision_of(raw: Mapping[str, Any]) -> str:
    return "bf16" if raw.get("bf16") else ("fp16" if raw.get("fp16") else "fp32")


def world_size_of(raw: Mapping[str, Any]) -> int:
    return int(raw.get("nproc_per_node") or 1) * int(raw.get("nnodes") or 1)


def strategy_of(raw: Mapping[str, Any]) -> str:
    if raw.get("deepspeed"):
        return "deepspeed (user config)"
    if raw.get("zero_stage"):
        off = raw.get("offload") or "none"
        return f"deepspeed ZeRO-{raw['zero_stage']}" + (f" + offload {off}" if off != "none" else "")
    if raw.get("fsdp"):
        return f"FSDP2 ({raw['fsdp']})"
    return "DDP" if world_size_of(raw) > 1 else "single process"


def shape_of(raw: Mapping[str, Any]) -> RunShape:
    zero = int(raw["zero_stage"]) if raw.get("zero_stage") and not raw.get("deepspeed") else None
    return RunShape(
        nproc_per_node=int(raw.get("nproc_per_node") or 1),
        nnodes=int(raw.get("nnodes") or 1),
        node_rank=int(raw.get("node_rank") or 0),
        precision=precision_of(raw),
        strategy=strategy_of(raw),
        zero_stage=zero,
        sharded=bool(raw.get("fsdp")) or zero == 3,
    )
