"""Probes: prompts with expected substrings, answered before and after training.

File format: JSON array or JSON lines of ``{"prompt": str, "expect": str | [str, ...]}``;
a probe passes when every expected substring appears in the greedy answer (case-insensitive).
"""

from __future__ import annotations

from typing import Any

from cockpit.data.probes import load_probes, passes
from cockpit.data.render import render_prompt_ids

__all__ = ["load_probes", "passes", "run_probes"]  # reading and scoring: cockpit.data.probes (torch-free, for the UI)


def run_probes(model: Any, tokenizer: Any, probes: list[dict[str, Any]], max_new_tokens: int = 40, batch_size: int = 8) -> dict[str, Any]:
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
            for j, p in enumerate(chunk):
                answer = tokenizer.decode(out[j, width:], skip_special_tokens=True).strip()
                results.append({"prompt": p["prompt"], "expect": p["expect"], "answer": answer, "ok": passes(answer, p["expect"])})
    finally:
        if was_training:
            model.train()
    passed = sum(r["ok"] for r in results)
    return {"passed": passed, "total": len(results), "rate": passed / len(results) if results else 0.0, "results": results}
