"""No fp32 copy of a LoRA layer's input where autocast would cast it straight back.

PEFT keeps a half-precision base's adapters in fp32 (``autocast_adapter_dtype``, as LLaMA-Factory
trains them) and so casts every adapted linear's input to fp32 before ``lora_A``
(``BaseTunerLayer._cast_input_dtype``). Under bf16/fp16 autocast that copy buys nothing:
``lora_A``'s linear casts it back to the autocast dtype, and it is that second copy autograd saves
for ``lora_A``'s weight gradient. Per adapted linear and token: an fp32 copy of the input in
forward and a saved half-precision one. For Llama-3.1-8B (all 7 linears adapted, 4096 tokens)
the layer being recomputed held 336 MiB of saved copies and a 224 MiB transient fp32 copy of
``down_proj``'s input (``bench/lora_layer_memory.py``).

A forward pre-hook turns PEFT's own switch (``cast_input_dtype_enabled``, the one
``peft.helpers.disable_input_dtype_casting`` sets) off while autocast is on and the input is
already in its dtype, and back on otherwise (evaluation without autocast, generation). Nothing
else changes: ``lora_A`` sees the same half-precision values either way (the fp32 round trip is
exact), so the losses and gradients are bit for bit the same (``tests/test_adapter_input_cast.py``).
AgileRL made the same change (AgileRL/AgileRL#623: bitwise-identical gradients, 20-24 % lower peak).

Only plain LoRA layers without dropout get the hook: dropout on fp32 draws its mask over a
different dtype (on a GPU the random stream can differ), and DoRA / other variants compute with
``x`` beyond ``lora_A``.
"""

from __future__ import annotations

from typing import Any


def skip_cast_under_autocast(model: Any) -> int:
    """Hook every plain, dropout-free LoRA layer of ``model``; returns how many were hooked."""
    plain = [module for module in model.modules() if _plain_lora(module)]
    for module in plain:
        module.register_forward_pre_hook(_cast_only_outside_autocast)
    return len(plain)


def _plain_lora(module: Any) -> bool:
    import torch

    dropouts = getattr(module, "lora_dropout", None)
    if not hasattr(module, "cast_input_dtype_enabled") or not hasattr(module, "lora_A") or not dropouts:
        return False
    if getattr(module, "lora_variant", None):  # DoRA and the other variants use x beyond lora_A
        return False
    return all(isinstance(d, torch.nn.Identity) for d in dropouts.values())


def _cast_only_outside_autocast(module: Any, args: tuple[Any, ...]) -> None:
    import torch

    x = args[0] if args else None
    if not isinstance(x, torch.Tensor):
        module.cast_input_dtype_enabled = True
        return
    kind = x.device.type
    under_autocast = torch.is_autocast_enabled(kind) and x.dtype == torch.get_autocast_dtype(kind)
    module.cast_input_dtype_enabled = not under_autocast
