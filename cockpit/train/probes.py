"""Probes: prompts with expected substrings, answered before and after training.

File format: JSON array or JSON lines of ``{"prompt": str, "expect": str | [str, ...], "set": str}``;
a probe passes when every expected substring appears in the greedy answer (case-insensitive).
``set`` (optional) groups probes: the demo asks ``identity`` probes (what training should teach)
and ``control`` probes (general questions the base model already answers: what it must not forget);
results and ``summary.json`` then also count each set.
"""

from __future__ import annotations

from typing import Any

from cockpit.data.probes import load_probes, passes, probe_summary, score
from cockpit.data.render import render_prompt_ids

__all__ = [
    "load_probes",
    "passes",
    "probe_summary",
    "run_probes",
    "score",
]  # reading and scoring: cockpit.data.probes (torch-free, for the UI)


def run_probes(
    model: Any, tokenizer: Any, probes: list[dict[str, Any]], max_new_tokens: int = 40, batch_size: int = 8
) -> dict[str, Any]:
    """Greedy answers for every probe (batched, left-padded); returns the probe_results fields."""
    import torch

    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    results = []
    try:
        for i in range(0, len(probes), batch_size):
            chunk = probes[i : i + batch_size]
            prompts = [render_prompt_ids(tokenizer, [{"role": "user", "content": p["prompt"]}]) for p in chunk]
            width = max(len(p) for p in prompts)
            ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(prompts), width), dtype=torch.long)
            for j, prompt_ids in enumerate(prompts):
                ids[j, width - len(prompt_ids) :] = torch.tensor(prompt_ids)
                mask[j, width - len(prompt_ids) :] = 1
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids.to(device),
                    attention_mask=mask.to(device),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    use_cache=True,  # training sets config.use_cache=False
                    pad_token_id=pad_id,
                    eos_token_id=tokenizer.eos_token_id,
                )
            for j, probe in enumerate(chunk):
                answer = tokenizer.decode(out[j, width:], skip_special_tokens=True).strip()
                results.append(
                    {
                        "prompt": probe["prompt"],
                        "expect": probe["expect"],
                        "answer": answer,
                        "ok": passes(answer, probe["expect"]),
                        **({"set": probe["set"]} if "set" in probe else {}),
                    }
                )
    finally:
        if was_training:
            model.train()
    return {**score(results), "results": results}
