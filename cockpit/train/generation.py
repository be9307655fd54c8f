"""Batched generation from token-id prompts (left-padded, the model in eval mode, the KV cache on):
the probes' greedy answers (``train/probes.py``), the predictions of ``do_predict``
(``train/predict.py``) and GRPO's held-out completions. A model whose parameters mix a half dtype
with fp32 (a bf16/fp16 base with its trainable copies upcast for training: adapters,
``additional_target``'s modules) generates under autocast to the half dtype, as it trained; outside
autocast an fp32 norm's output would meet a half linear ("expected mat1 and mat2 to have the same
dtype", first seen on a GPU)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def generate_new_tokens(
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    on_token: Callable[[int], bool | None] | None = None,
    batch_inputs: Callable[[Any], dict[str, Any]] | None = None,
    **generate_kwargs: Any,
) -> list[list[int]]:
    """Each prompt's generated token ids (the prompt left out), in one left-padded batch.
    ``generate_kwargs`` go to ``model.generate`` (max_new_tokens, do_sample, ...); ``on_token(n)``: called
    after each generated position with the tokens generated so far (a batch's progress); true: the batch
    ends there (a stop request); ``batch_inputs(input_ids)``: the model's other inputs for the left-padded batch
    (a vision-language model's ``pixel_values``, its token-type mark)."""
    import torch

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt_ids in enumerate(prompts):
        ids[row, width - len(prompt_ids) :] = torch.tensor(prompt_ids)
        mask[row, width - len(prompt_ids) :] = 1
    if batch_inputs is not None:
        generate_kwargs.update(batch_inputs(ids.to(device)))
    if on_token is not None:
        generate_kwargs["stopping_criteria"] = token_ticks(on_token, width)
    try:
        with torch.no_grad(), generation_autocast(model):
            out = model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                use_cache=True,  # training sets config.use_cache=False
                pad_token_id=pad_id,
                eos_token_id=tokenizer.eos_token_id,
                **generate_kwargs,
            )
    finally:
        if was_training:
            model.train()
    return [out[row, width:].tolist() for row in range(len(prompts))]


def token_ticks(on_token: Callable[[int], bool | None], prompt_width: int) -> Any:
    """A ``StoppingCriteriaList`` that tells ``on_token`` how many tokens the batch has generated, once per
    position (HF's one hook inside ``generate``'s loop), and ends the batch when it answers true."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class Ticks(StoppingCriteria):  # type: ignore[misc]  # StoppingCriteria is Any here (follow_imports = skip)
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            end = bool(on_token(int(input_ids.shape[1]) - prompt_width))
            return torch.full((input_ids.shape[0],), end, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([Ticks()])


def mixed_half_dtype(model: Any) -> Any:
    """The half dtype (bf16 or fp16) the model's floating parameters mix with fp32, else None (one dtype
    throughout, or a quantized base's integer weights beside a single float dtype)."""
    import torch

    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    halves = dtypes & {torch.bfloat16, torch.float16}
    if torch.float32 in dtypes and len(halves) == 1:
        return halves.pop()
    return None


def generation_autocast(model: Any) -> Any:
    """Autocast to the model's half dtype where its parameters mix it with fp32 (:func:`mixed_half_dtype`),
    on the device of its parameters; a context that does nothing otherwise."""
    import torch

    half = mixed_half_dtype(model)
    device = next(model.parameters()).device
    return torch.autocast(device.type, dtype=half, enabled=half is not None)
