"""Batched generation from token-id prompts (left-padded, the model in eval mode, the KV cache on):
the probes' greedy answers (``train/probes.py``) and the predictions of ``do_predict``
(``train/predict.py``)."""

from __future__ import annotations

from typing import Any


def generate_new_tokens(
    model: Any, tokenizer: Any, prompts: list[list[int]], **generate_kwargs: Any
) -> list[list[int]]:
    """Each prompt's generated token ids (the prompt left out), in one left-padded batch.
    ``generate_kwargs`` go to ``model.generate`` (max_new_tokens, do_sample, ...)."""
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
    try:
        with torch.no_grad():
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
