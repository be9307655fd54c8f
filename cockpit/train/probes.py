"""Probes: prompts with expected substrings, answered before and after training.

File format: JSON array or JSON lines of ``{"prompt": str, "expect": str | [str, ...], "set": str}``;
a probe passes when every expected substring appears in the greedy answer (case-insensitive).
``set`` (optional) groups probes: the demo asks ``identity`` probes (what training should teach)
and ``control`` probes (general questions the base model already answers: what it must not forget);
results and ``summary.json`` then also count each set.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cockpit.data.probes import load_probes, passes, probe_summary, score
from cockpit.data.render import render_prompt_ids
from cockpit.train.generation import generate_new_tokens
from cockpit.train.progress import OnProgress, silent

__all__ = [
    "load_probes",
    "passes",
    "probe_summary",
    "run_probes",
    "score",
]  # reading and scoring: cockpit.data.probes (torch-free, for the UI)


TOKENS_EVERY_S = 2.0


def run_probes(
    model: Any,
    tokenizer: Any,
    probes: list[dict[str, Any]],
    max_new_tokens: int = 40,
    batch_size: int = 8,
    on_progress: OnProgress = silent,
    should_stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Greedy answers for every probe (batched, left-padded); returns the probe_results fields.
    ``on_progress(done, total)``: called before the first batch and after each (progress events), and
    while a batch generates, every TOKENS_EVERY_S, with its ``tokens`` and ``max_tokens`` (a CPU's batch
    of 8 takes a minute: the line moves). ``should_stop()`` true (a stop request, one process only: no
    other rank waits in a collective): the answers end at once, the batch being generated is left out,
    and the result says ``stopped`` with the probes answered so far."""
    results: list[dict[str, Any]] = []
    on_progress(0, len(probes))
    said = [time.monotonic()]
    stopped = [False]

    def on_token(n: int) -> bool:
        if time.monotonic() - said[0] >= TOKENS_EVERY_S and n < max_new_tokens:
            said[0] = time.monotonic()
            on_progress(len(results), len(probes), tokens=n, max_tokens=max_new_tokens)
        stopped[0] = stopped[0] or (should_stop is not None and should_stop())
        return stopped[0]

    for i in range(0, len(probes), batch_size):
        if should_stop is not None and should_stop():
            stopped[0] = True
        if stopped[0]:
            break
        chunk = probes[i : i + batch_size]
        prompts = [render_prompt_ids(tokenizer, [{"role": "user", "content": p["prompt"]}]) for p in chunk]
        answers = generate_new_tokens(
            model, tokenizer, prompts, on_token=on_token, max_new_tokens=max_new_tokens, do_sample=False
        )
        if stopped[0]:  # cut short: these answers are not the model's whole answers
            break
        for probe, answer_ids in zip(chunk, answers):
            answer = tokenizer.decode(answer_ids, skip_special_tokens=True).strip()
            results.append(
                {
                    "prompt": probe["prompt"],
                    "expect": probe["expect"],
                    "answer": answer,
                    "ok": passes(answer, probe["expect"]),
                    **({"set": probe["set"]} if "set" in probe else {}),
                }
            )
        on_progress(len(results), len(probes))
        said[0] = time.monotonic()
    return {**score(results), "results": results, **({"stopped": True} if stopped[0] else {})}
