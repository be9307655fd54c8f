"""Held-out pairs, measured before and after training.

- a policy (dpo): does it prefer the chosen answer? The summed log-probability of the chosen
  answer against the rejected one, given the prompt (the answer tokens split from the prompt
  where TRL splits them). Accuracy: the fraction of pairs where chosen scores higher.
- a reward model (rm): does its value head score the chosen answer higher?
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from cockpit.data.stage_data import _common_prefix, _ids
from cockpit.train.progress import OnProgress, silent


def _answer_logp(
    model: Any, tokenizer: Any, prompt: list[dict[str, str]], answer: str, images: Callable[[Any], Any] | None = None
) -> float:
    """The answer's summed log-probability; ``images``: input_ids -> the pair's image inputs (a VLM's)."""
    import torch

    p_ids = _ids(tokenizer, prompt, True)
    full = _ids(tokenizer, prompt + [{"role": "assistant", "content": answer}], False)
    start = max(1, _common_prefix(p_ids, full))
    device = next(model.parameters()).device
    ids = torch.tensor([full], device=device)
    extra = {k: v.to(device) for k, v in images(ids).items()} if images else {}
    logits = model(input_ids=ids, **extra).logits[0, :-1].float()
    logps = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0]
    return float(logps[start - 1 :].sum())


def policy_preference(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[dict[str, Any]],
    on_progress: OnProgress = silent,
    images: Callable[[list[str], Any], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``images``: (a pair's image paths, input_ids) -> the model's image inputs (a vision-language model:
    its pair collator's, cockpit.train.recipes.preference.PairImages.inputs_for)."""
    import torch

    was_training = model.training
    model.eval()
    margins: list[float] = []
    on_progress(0, len(pairs))
    try:
        with torch.no_grad():
            for p in pairs:
                paths = [i["path"] for i in p.get("images") or ()]
                pair_images = partial(images, paths) if paths and images is not None else None
                margins.append(
                    _answer_logp(model, tokenizer, p["prompt"], p["chosen"], pair_images)
                    - _answer_logp(model, tokenizer, p["prompt"], p["rejected"], pair_images)
                )
                on_progress(len(margins), len(pairs))
    finally:
        if was_training:
            model.train()
    wins = sum(1 for m in margins if m > 0)
    return {
        "pairs": len(margins),
        "accuracy": round(wins / len(margins), 4) if margins else None,
        "mean_logp_margin": round(sum(margins) / len(margins), 4) if margins else None,
    }


def reward_preference(
    model: Any, tokenizer: Any, pairs: Sequence[dict[str, Any]], on_progress: OnProgress = silent
) -> dict[str, Any]:
    import torch

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    margins: list[float] = []
    on_progress(0, len(pairs))

    def score(prompt: list[dict[str, str]], answer: str) -> float:
        ids = _ids(tokenizer, prompt + [{"role": "assistant", "content": answer}], False)
        return float(model(input_ids=torch.tensor([ids], device=device)).logits[0, 0])

    try:
        with torch.no_grad():
            for p in pairs:
                margins.append(score(p["prompt"], p["chosen"]) - score(p["prompt"], p["rejected"]))
                on_progress(len(margins), len(pairs))
    finally:
        if was_training:
            model.train()
    wins = sum(1 for m in margins if m > 0)
    return {
        "pairs": len(margins),
        "accuracy": round(wins / len(margins), 4) if margins else None,
        "mean_reward_margin": round(sum(margins) / len(margins), 4) if margins else None,
    }
