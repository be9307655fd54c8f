"""Probes: prompts with expected substrings, answered before and after training.

File format: JSON array or JSON lines of ``{"prompt": str, "expect": str | [str, ...], "set": str}``;
a probe passes when every expected substring appears in the greedy answer (case-insensitive).
``set`` (optional) groups probes: the demo asks ``identity`` probes (what training should teach)
and ``control`` probes (general questions the base model already answers: what it must not forget);
results and ``summary.json`` then also count each set.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from cockpit.data.probes import load_probes, passes, probe_summary, score
from cockpit.data.render import render_prompt_ids
from cockpit.train.generation import generate_new_tokens
from cockpit.train.progress import OnProgress, silent
from cockpit.train.vlm import ModelImages

__all__ = [
    "load_probes",
    "probes_of",
    "passes",
    "probe_summary",
    "run_probes",
    "score",
]  # reading and scoring: cockpit.data.probes (torch-free, for the UI)


TOKENS_EVERY_S = 2.0
IMAGE_FIELDS = ("image", "image_size", "image_path")  # an image probe's, in its result (the Summary shows them)


IMAGE_BOUNDS = "image_pixels"  # an image probe's (image_max_pixels, image_min_pixels): the run's, from probes_of


def probes_of(cfg: Any) -> list[dict[str, Any]]:
    """The config's probes file, each image probe carrying the run's image_max_pixels / image_min_pixels (its
    image is resized as the run's rows are)."""
    bounds = (int(cfg.image_max_pixels), int(cfg.image_min_pixels))
    return [{**p, IMAGE_BOUNDS: bounds} if "image_path" in p else p for p in load_probes(cfg.probes)]


class ProbeImages(ModelImages):
    """A vision-language model's view of the image probes (:class:`cockpit.train.vlm.ModelImages`): each probe's
    ``<image>`` becomes its image's tokens, the batch gets their ``pixel_values``. The images are resized within
    the run's image_max_pixels / image_min_pixels, which :func:`probes_of` stamps on each image probe
    (LLaMA-Factory's defaults without)."""

    def __init__(self, model: Any, tokenizer: Any, probes: list[dict[str, Any]]) -> None:
        from cockpit.data import mm_plugins

        defaults = mm_plugins.ImageFacts()
        bounds = next(
            (p[IMAGE_BOUNDS] for p in probes if IMAGE_BOUNDS in p),
            (defaults.image_max_pixels, defaults.image_min_pixels),
        )
        super().__init__(model, tokenizer, bounds, "image probes", "probes")

    def prompt(self, probe: dict[str, Any], tokenizer: Any) -> list[int]:
        """The probe's prompt ids; an image probe's ``<image>`` as its image's tokens."""
        messages = [{"role": "user", "content": probe["prompt"]}]
        if "image_path" in probe:
            messages = self.expanded(messages, [probe["image_size"]])
        return render_prompt_ids(tokenizer, messages)

    def inputs(self, chunk: list[dict[str, Any]], ids: Any) -> dict[str, Any]:
        """``pixel_values`` (and the plugin's batch keys) of the chunk's image probes in their order; ``ids``:
        the batch's left-padded input ids."""
        return self.batch_inputs([p["image_path"] for p in chunk if "image_path" in p], ids)


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
    seeing = ProbeImages(model, tokenizer, probes) if any("image_path" in p for p in probes) else None
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
        if seeing is None:
            prompts = [render_prompt_ids(tokenizer, [{"role": "user", "content": p["prompt"]}]) for p in chunk]
        else:
            prompts = [seeing.prompt(p, tokenizer) for p in chunk]
        answers = generate_new_tokens(
            model,
            tokenizer,
            prompts,
            on_token=on_token,
            batch_inputs=None if seeing is None else functools.partial(seeing.inputs, chunk),
            max_new_tokens=max_new_tokens,
            do_sample=False,
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
                    **{k: probe[k] for k in IMAGE_FIELDS if k in probe},
                }
            )
        on_progress(len(results), len(probes))
        said[0] = time.monotonic()
    return {**score(results), "results": results, **({"stopped": True} if stopped[0] else {})}
