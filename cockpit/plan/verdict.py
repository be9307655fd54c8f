"""Fits / tight / does not fit, and the cheapest change that makes a plan fit (re-planned)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cockpit.errors import InputError

TIGHT_HEADROOM = 0.10

# LLaMA-Factory's example DeepSpeed files (the planner also reads the stage from these names)
Z3 = "examples/deepspeed/ds_z3_config.json"
Z3_OFFLOAD = "examples/deepspeed/ds_z3_offload_config.json"


def verdict(peak_bytes: float, capacity_bytes: float) -> dict[str, Any]:
    """fits: >= 10 % headroom; tight: 0-10 %; does not fit: over capacity."""
    headroom = (capacity_bytes - peak_bytes) / capacity_bytes
    status = "fits" if headroom >= TIGHT_HEADROOM else "tight" if headroom >= 0 else "does not fit"
    return {"status": status, "headroom": round(headroom, 4), "capacity_bytes": int(capacity_bytes)}


STATUS_ORDER = ("fits", "tight", "does not fit")


def worst(device: dict[str, Any] | None, host: dict[str, Any] | None) -> dict[str, Any] | None:
    """The plan's one verdict: the worst of the device's and the host line's (None: neither has one);
    ``by`` names the lines that give it."""
    given = {name: v for name, v in (("device", device), ("host RAM", host)) if v}
    if not given:
        return None
    status = max((v["status"] for v in given.values()), key=STATUS_ORDER.index)
    return {"status": status, "by": [name for name, v in given.items() if v["status"] == status]}


def candidate_changes(cfg: Mapping[str, Any], run: Any) -> list[tuple[str, str, dict[str, Any]]]:
    """Single changes, cheapest first: (kind, why, changed keys). ``run`` is the parsed RunSpec."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    if not run.gradient_checkpointing:
        out.append(
            (
                "ckpt",
                "turn on gradient checkpointing (recomputes each layer in backward, ~30% slower)",
                {"gradient_checkpointing": True},
            )
        )
    mb, ga = run.micro_batch, run.grad_accum
    b = mb // 2
    while b >= 1:
        if mb % b == 0:
            out.append(
                (
                    "mb",
                    f"micro-batch {mb} -> {b} with gradient accumulation {ga} -> {ga * mb // b} (same global batch)",
                    {"per_device_train_batch_size": b, "gradient_accumulation_steps": ga * mb // b},
                )
            )
        b //= 2
    if run.gradient_checkpointing and not run.offload_checkpoints:
        out.append(
            (
                "offload_ckpt",
                "keep the gradient checkpoints (each layer's input) in host memory: a copy to the host in forward "
                "and back in backward per layer",
                {"use_unsloth_gc": True},
            )
        )
    sharded3 = (run.zero is not None and run.zero.stage == 3) or (
        run.fsdp is not None and run.fsdp.strategy in ("full_shard", "hybrid_shard")
    )
    offloaded = (run.zero is not None and (run.zero.offload_optimizer or run.zero.offload_param)) or (
        run.fsdp is not None and run.fsdp.offload
    )
    no_fsdp = {"fsdp": None} if run.fsdp is not None else {}
    if run.world > 1 and not sharded3:
        out.append(
            (
                "zero3",
                f"shard weights, gradients and optimizer states over the {run.world} devices with "
                "ZeRO-3 (or fsdp: full_shard auto_wrap)",
                {"deepspeed": Z3, **no_fsdp},
            )
        )
    if not offloaded:
        out.append(
            (
                "offload",
                "ZeRO-3 with optimizer states and parameters offloaded to CPU memory (much slower steps)",
                {"deepspeed": Z3_OFFLOAD, **no_fsdp},
            )
        )
    if run.quantization_bit != 4:
        out.append(
            (
                "qlora",
                "QLoRA: LoRA adapters on a 4-bit NF4 base model",
                {"finetuning_type": "lora", "quantization_bit": 4},
            )
        )
    return out


def find_fix(
    cfg: Mapping[str, Any], run: Any, capacity: float, replan: Callable[[dict[str, Any]], float]
) -> dict[str, Any] | None:
    """The cheapest change that fits (>= 10 % headroom), re-planned to confirm.

    Single changes first, in order of cost; then the same changes accumulated in that order (for
    micro-batch: the largest one that fits). A change that only reaches "tight" is returned when
    nothing reaches "fits". None when nothing fits at all.
    """
    tried: list[dict[str, Any]] = []
    fallback: dict[str, Any] | None = None

    def attempt(why: str, changes: dict[str, Any]) -> dict[str, Any]:
        try:
            peak = replan({**cfg, **changes})
        except InputError:  # a change the config refuses (e.g. ZeRO for a stage that runs under DDP): no fix
            return {"why": why, "changes": changes, "status": "refused"}
        res = {"why": why, "changes": changes, "peak_bytes": int(peak), **verdict(peak, capacity)}
        tried.append(res)
        return res

    singles = candidate_changes(cfg, run)
    for _kind, why, ch in singles:
        res = attempt(why, ch)
        if res["status"] == "fits":
            return {**res, "tried": tried[:-1]}
        if res["status"] == "tight" and fallback is None:
            fallback = res
    acc: dict[str, Any] = {}
    whys: list[str] = []
    kinds_done: set[str] = set()
    mb_options = [(w, ch) for k, w, ch in singles if k == "mb"]
    for kind, why, ch in singles:
        if kind in kinds_done:
            continue
        kinds_done.add(kind)
        if kind == "mb":
            options = mb_options
        else:
            options = [(why, ch)]
        for j, (w, c) in enumerate(options):
            res = attempt(" + ".join(whys + [w]), {**acc, **c})
            last = j == len(options) - 1
            if res["status"] == "fits":
                return {**res, "tried": tried[:-1]}
            if res["status"] == "tight" and fallback is None:
                fallback = res
            if last and res["status"] != "refused":
                acc = {**acc, **c}
                whys.append(w)
    if fallback is not None:
        return {**fallback, "tried": [t for t in tried if t is not fallback]}
    return None
