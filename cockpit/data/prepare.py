"""Config + tokenizer -> rendered training samples and the truncation report.

One code path for ``cockpit check`` and the training ranks.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.data import media, tokenized
from cockpit.data.collect import collect_samples
from cockpit.data.formats import LoadResult
from cockpit.data.render import IGNORE_INDEX, Rendered, apply_template_choice, render_sample, template_default_system
from cockpit.data.report import TruncationReport, truncation_report
from cockpit.errors import InputError, Problem

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


@dataclass
class Prepared:
    loaded: LoadResult
    rendered: list[Rendered]
    report: TruncationReport
    image_seqlen: int | None = None  # image tokens per image, when the data have images (cockpit.data.media)

    def rows(self) -> list[dict[str, Any]]:
        """The trainer's rows: each trainable sample's ``input_ids`` and ``labels``, and its images' paths
        when it has images (in their tokens' order: the collator makes their ``pixel_values``)."""
        return [
            {"input_ids": r.input_ids, "labels": r.labels}
            | ({"images": [i["path"] for i in s["images"]]} if s.get("images") else {})
            for s, r in zip(self.loaded.samples, self.rendered)
            if r.target_kept > 0  # trainable's rule
        ]

    @property
    def trainable(self) -> list[Rendered]:
        """The rendered samples that keep an assistant token after cutoff_len: what the ranks train on
        and ``cockpit check`` counts (the others teach nothing and are dropped)."""
        return [r for r in self.rendered if r.target_kept > 0]


_POOL_TOKENIZER: Any = None


def masking(cfg: RunConfig) -> dict[str, bool]:
    """Which tokens carry the loss: ``train_on_prompt`` and ``mask_history`` (render.trainable_spans)."""
    return {"train_on_prompt": bool(cfg.train_on_prompt), "mask_history": bool(cfg.mask_history)}


def render_options(cfg: RunConfig) -> dict[str, Any]:
    """render_sample's options from the config: the masking keys, how tools are written, the default system."""
    system = template_default_system(cfg.template, cfg.default_system)
    return {**masking(cfg), "tool_format": cfg.tool_format, "default_system": system}


def _render_one(args: tuple[Any, dict[str, Any], int, dict[str, Any]]) -> tuple[Rendered | None, str | None]:
    tokenizer, sample, cutoff, options = args
    tok = tokenizer if tokenizer is not None else _POOL_TOKENIZER
    try:
        return render_sample(tok, sample["messages"], cutoff, tools=sample.get("tools"), **options), None
    except Exception as exc:  # noqa: BLE001 - a template error on one row: reported by its line
        return None, str(exc)


def _pool_init(tokenizer: Any) -> None:
    global _POOL_TOKENIZER
    _POOL_TOKENIZER = tokenizer


def render_all(
    tokenizer: Any, samples: list[dict[str, Any]], cutoff: int, workers: int = 1, mask: dict[str, Any] | None = None
) -> list[tuple[Rendered | None, str | None]]:
    """Render (tokenise + mask) every sample, in order; ``preprocessing_num_workers`` > 1 splits
    the work over that many processes (each with the tokenizer). Per sample: (rendered, None) or
    (None, the error).

    The pool is spawned, never forked: a fork of a process with threads (a rank's telemetry
    thread, pytest-xdist's, the tokenizers' own) can copy a lock another thread holds, and the
    child then waits on it forever (a forked tokenising child in CI sat on a futex for 12 min)."""
    mask = mask or {}
    if workers <= 1 or len(samples) < 2:
        return [_render_one((tokenizer, s, cutoff, mask)) for s in samples]
    import multiprocessing as mp

    ctx = mp.get_context("spawn")  # never fork: see cockpit.data.prepare.render_all
    procs = min(workers, len(samples), os.cpu_count() or 1)  # more processes than cores gain nothing
    with ctx.Pool(procs, initializer=_pool_init, initargs=(tokenizer,)) as pool:
        chunk = max(1, len(samples) // (workers * 4))
        return pool.map(_render_one, [(None, s, cutoff, mask) for s in samples], chunksize=chunk)


@dataclass(frozen=True)
class ImagePlan:
    """How the config's model reads images: its image token's id and how many tokens one image becomes."""

    token_id: int
    seqlen: int


def image_plan(cfg: RunConfig, samples: list[dict[str, Any]]) -> ImagePlan | None:
    """The model's image plan when some sample has images (None when none has); InputError when the
    model takes no images."""
    if not any(s.get("images") for s in samples):
        return None
    from cockpit.models.resolve import config_model, load_model_config, load_processor
    from cockpit.models.vlm import composite_of, image_seqlen

    if cfg.tokenized_path:
        raise InputError(Problem("a dataset with images: not cached as tokens yet (issue 63)", key="tokenized_path"))
    ref = config_model(cfg, log=lambda *_: None)
    model_config = load_model_config(cfg, ref)
    if composite_of(model_config) is None:
        kind = getattr(model_config, "model_type", None)
        raise InputError(
            Problem(
                f"the dataset has images, but {cfg.model_name_or_path} (model type {kind!r}) is a text model; images "
                "train with a vision-language model (LLaVA)",
                key="model_name_or_path",
            )
        )
    return ImagePlan(int(model_config.image_token_index), image_seqlen(load_processor(cfg, ref)))


def _image_problem(sample: dict[str, Any], result: Rendered, plan: ImagePlan, cutoff: int) -> str | None:
    """A rendered row whose image tokens are not all there (cut by cutoff_len, or the tokenizer has no ``<image>``)."""
    want = len(sample["images"]) * plan.seqlen
    have = result.input_ids.count(plan.token_id)
    if have == want:
        return None
    if want >= cutoff:
        return (
            f"its {want} image tokens ({len(sample['images'])} image(s) of {plan.seqlen} tokens) alone reach cutoff_len "
            f"{cutoff}: a cut image cannot train; raise cutoff_len or give the row fewer images"
        )
    if have == 0 and result.full_length <= cutoff:
        return f"the tokenizer does not read {media.IMAGE_PLACEHOLDER} as the model's image token (id {plan.token_id})"
    return (
        f"cutoff_len {cutoff} cuts this row's image tokens: {have} of {want} kept ({len(sample['images'])} image(s) of "
        f"{plan.seqlen} tokens); a cut image cannot train: raise cutoff_len"
    )


def _unlabelled(result: Rendered, token_id: int) -> list[int]:
    """The row's labels with its image tokens out of the loss (train_on_prompt would train them)."""
    return [IGNORE_INDEX if t == token_id else label for t, label in zip(result.input_ids, result.labels)]


def _render_kept(
    cfg: RunConfig, tokenizer: Any, samples: list[dict[str, Any]], cutoff: int
) -> tuple[list[Rendered], list[dict[str, Any]], list[Problem], ImagePlan | None]:
    """(rendered, the samples rendered, problems by row): ``rendered[i]`` is ``kept[i]``'s (prediction reads
    both); a row's images become its image tokens (:func:`image_plan`)."""
    plan = image_plan(cfg, samples)
    to_render = [
        {**s, "messages": media.expanded(s["messages"], plan.seqlen)} if plan and s.get("images") else s
        for s in samples
    ]
    rendered: list[Rendered] = []
    kept: list[dict[str, Any]] = []
    problems: list[Problem] = []
    workers = int(cfg.preprocessing_num_workers or 1)
    for sample, (result, error) in zip(samples, render_all(tokenizer, to_render, cutoff, workers, render_options(cfg))):
        if error is not None:  # a template error on one row: reported by its line
            error = f"cannot render with the chat template: {error}"
        elif plan and sample.get("images"):
            error = _image_problem(sample, result, plan, cutoff)
            result = dataclasses.replace(result, labels=_unlabelled(result, plan.token_id))
        if error is None:
            rendered.append(result)
            kept.append(sample)
        else:
            file, _, line = sample["source"].rpartition(":")
            problems.append(Problem(error, file=file, line=int(line)))
    return rendered, kept, problems, plan


def prepare_dataset(cfg: RunConfig, tokenizer: Any, loaded: LoadResult | None = None) -> Prepared:
    try:
        apply_template_choice(tokenizer, cfg.template, cfg.default_system, cfg.enable_thinking)
    except ValueError as exc:
        raise InputError(Problem(str(exc), key="template")) from None
    cutoff = int(cfg.cutoff_len)
    cache = Path(cfg.tokenized_path) if cfg.tokenized_path and loaded is None else None
    if cache is not None:
        want = tokenized.fingerprint(cfg, tokenizer)
        hit = None if cfg.overwrite_cache else tokenized.load(cache, want)
        if hit is not None:
            return Prepared(hit[0], hit[1], truncation_report(hit[1], cutoff))
    if loaded is None:
        loaded = collect_samples(cfg)
    rendered, kept, problems, plan = _render_kept(cfg, tokenizer, loaded.samples, cutoff)
    if problems:
        if not cfg.allow_bad_rows:
            raise InputError(problems)
        loaded.problems += problems
    if not rendered:
        raise InputError("no sample could be rendered")
    loaded.samples = kept
    if cache is not None:
        tokenized.save(cache, want, loaded, rendered)
    return Prepared(loaded, rendered, truncation_report(rendered, cutoff), plan.seqlen if plan else None)
