"""Where a run keeps its input embedding: the rule the planner and the training rank share.

A LoRA run never trains the input embedding, and a micro-batch reads a few thousand of its rows
(Llama-3.1-8B: 4096 of 128,256 at 2 x 2048 tokens): the rest of its 1 GiB on the device is dead
weight. The rank keeps that weight in host memory and copies only the rows a forward reads
(:mod:`cockpit.train.host_embedding`); the planner moves its bytes to the host line. This module
says, from the config alone, when that cannot be done; the rank also checks the model (a tied LM
head, an embedding that is not a plain ``nn.Embedding``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def _names(value: Any) -> set[str]:
    if isinstance(value, (list, tuple)):
        return {str(v).strip() for v in value}
    return {v.strip() for v in str(value or "").split(",") if v.strip()}


def host_embedding_off(cfg: RunConfig, sharded: bool) -> str:
    """Why a run keeps its input embedding on the device ("" when it goes to host memory, model
    permitting). ``sharded``: ZeRO-3 or FSDP (any strategy) places the parameters."""
    ft = cfg.finetuning_type
    if ft != "lora":
        return f"finetuning_type {ft}: only a LoRA run keeps the embedding frozen and out of its checkpoints"
    if cfg.stage == "grpo":
        return "stage grpo generates token by token (a host round trip per token)"
    if sharded:
        return "ZeRO-3 / FSDP place the parameters"
    if cfg.torch_compile:
        return "torch.compile"
    adapted = _names(cfg.lora_target) | _names(cfg.additional_target)
    if "embed_tokens" in adapted:
        return "embed_tokens is adapted (lora_target / additional_target)"
    grown = [key for key in ("resize_vocab", "add_tokens", "add_special_tokens") if getattr(cfg, key)]
    if grown:
        return f"{grown[0]}: the embedding's new rows train"
    return ""
