"""Fits / tight / does not fit, and the cheapest change that makes a plan fit (re-planned)."""

from __future__ import annotations

from typing import Any, Callable

TIGHT_HEADROOM = 0.10

Z3 = "examples/deepspeed/ds_z3_config.json"
Z3_OFFLOAD = "examples/deepspeed/ds_z3_offload_config.json"


def verdict(peak_bytes: float, capacity_bytes: float) -> dict[str, Any]:
    headroom = (capacity_bytes - peak_bytes) / capacity_bytes
    status = "fits" if headroom >= TIGHT_HEADROOM else "tight" if headroom >= 0 else "does not fit"
    return {"status": status, "headroom": round(headroom, 4), "capacity_bytes": int(capacity_bytes)}


def candidate_changes(cfg: dict[str, Any], world: int) -> list[tuple[str, dict[str, Any]]]:
    """Single changes, cheapest first: (why, changed keys)."""
    out: list[tuple[str, dict[str, Any]]] = []
    if not cfg.get("gradient_checkpointing"):
        out.append(("turn on gradient checkpointing (recomputes each layer in backward, ~30% slower)",
                    {"gradient_checkpointing": True}))
    mb = int(cfg.get("per_device_train_batch_size") or 1)
    ga = int(cfg.get("gradient_accumulation_steps") or 1)
    b = mb // 2
    while b >= 1:
        if mb % b == 0:
            out.append((f"micro-batch {mb} -> {b} with accumulation {ga} -> {ga * mb // b} (same global batch)",
                        {"per_device_train_batch_size": b, "gradient_accumulation_steps": ga * mb // b}))
        b //= 2
    zero = cfg.get("deepspeed")
    if world > 1 and not cfg.get("fsdp") and "z3" not in str(zero or "") and "3" not in str(zero or "")[-12:]:
        out.append((f"shard weights, gradients and optimizer states over the {world} devices with ZeRO-3 "
                    "(or fsdp: full_shard auto_wrap)", {"deepspeed": Z3, "fsdp": None}))
    if "offload" not in str(zero or "") and "offload" not in str(cfg.get("fsdp") or ""):
        out.append(("ZeRO-3 with optimizer and parameters offloaded to CPU memory (much slower steps)",
                    {"deepspeed": Z3_OFFLOAD, "fsdp": None}))
    if cfg.get("quantization_bit") != 4:
        out.append(("QLoRA: LoRA on a 4-bit NF4 base model", {"finetuning_type": "lora", "quantization_bit": 4,
                                                                "deepspeed": cfg.get("deepspeed"), "fsdp": cfg.get("fsdp")}))
    return out


def find_fix(cfg: dict[str, Any], world: int, capacity: float,
             replan: Callable[[dict[str, Any]], float]) -> dict[str, Any] | None:
    """First single change that fits; else the cheapest cumulative combination; None if nothing does."""
    singles = candidate_changes(cfg, world)
    tried: list[dict[str, Any]] = []
    for why, ch in singles:
        peak = replan({**cfg, **ch})
        v = verdict(peak, capacity)
        tried.append({"why": why, "changes": ch, "peak_bytes": int(peak), **v})
        if v["status"] != "does not fit":
            return {"why": why, "changes": ch, "peak_bytes": int(peak), **v, "tried": tried[:-1]}
    # cumulative: each kind of change once, in order of cost (smallest micro-batch step that fits)
    acc: dict[str, Any] = {}
    whys: list[str] = []
    seen_kind: set[str] = set()
    for why, ch in singles:
        kind = next(iter(ch))
        if kind == "per_device_train_batch_size":
            kind = "mb"
        if kind in seen_kind and kind != "mb":
            continue
        seen_kind.add(kind)
        trial = {**acc, **ch}
        peak = replan({**cfg, **trial})
        v = verdict(peak, capacity)
        if kind == "mb" and v["status"] == "does not fit" and ch["per_device_train_batch_size"] > 1:
            continue
        acc = trial
        whys = [w for w in whys if not (kind == "mb" and w.startswith("micro-batch"))] + [why]
        if v["status"] != "does not fit":
            return {"why": " + ".join(whys), "changes": acc, "peak_bytes": int(peak), **v, "tried": tried}
    return None
