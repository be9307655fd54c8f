"""Config + tokenizer -> rendered training samples and the truncation report.

One code path for ``cockpit check`` and the training ranks.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.data import mm_plugins, tokenized
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
    image_plan: ImagePlan | None = None  # how the model reads the rows' images, when they have images

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
    """How the config's model reads images: its template's image plugin, the facts it counts with (read
    from the model folder) and the id of the image token (cockpit.data.mm_plugins)."""

    plugin: mm_plugins.ImagePlugin
    facts: mm_plugins.ImageFacts
    token_id: int

    @property
    def seqlen(self) -> int:
        """The image tokens of every image, for a plugin whose count is fixed (LLaVA); ValueError when the
        count varies by image (Qwen2-VL: :meth:`texts` gives each image's)."""
        if not self.facts.seqlen:
            raise ValueError(f"template {self.plugin.name}: the image token count varies by image (use texts())")
        return self.facts.seqlen

    def tokens(self, size: Any) -> int:
        """Image tokens of one image of this size (width, height)."""
        return mm_plugins.image_tokens(self.plugin, self.facts, tuple(size))

    def texts(self, images: list[dict[str, Any]]) -> list[str]:
        """What replaces each image's ``<image>``, in order."""
        return [mm_plugins.image_text(self.plugin, self.facts, tuple(i["size"])) for i in images]


def _model_problem(cfg: RunConfig, model_config: Any) -> str | None:
    """Why this model cannot read the rows' images with the config's template (None when it can)."""
    from cockpit.models.vlm import composite_of

    parts = composite_of(model_config)
    kind = getattr(model_config, "model_type", None)
    if parts is None:
        return (
            f"the dataset has images, but {cfg.model_name_or_path} (model type {kind!r}) is a text model; images "
            "train with a vision-language model (LLaVA, Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3)"
        )
    if cfg.template not in parts.templates:
        return (
            f"template {cfg.template!r} renders images for another model family: model type {kind!r} takes "
            f"template {' or '.join(repr(t) for t in parts.templates)} (LLaMA-Factory's)"
        )
    return None


def image_plan(cfg: RunConfig, samples: list[dict[str, Any]], tokenizer: Any = None) -> ImagePlan | None:
    """The model's image plan when some sample has images (None when none has); InputError when the
    model takes no images, or not with this template."""
    if not any(s.get("images") for s in samples):
        return None
    from cockpit.models.resolve import config_model, load_model_config
    from cockpit.models.vlm import image_token_id

    if cfg.tokenized_path:
        raise InputError(Problem("a dataset with images: not cached as tokens yet (issue 63)", key="tokenized_path"))
    ref = config_model(cfg, log=lambda *_: None)
    model_config = load_model_config(cfg, ref)
    why = _model_problem(cfg, model_config)
    if why:
        raise InputError(Problem(why, key="model_name_or_path" if "text model" in why else "template"))
    plugin = mm_plugins.plugin_for(cfg.template)
    assert plugin is not None  # the composite's template is a plugin's (cockpit.models.vlm.COMPOSITE)
    facts, _ = mm_plugins.load(
        plugin,
        ref.path,
        cfg.image_max_pixels,
        cfg.image_min_pixels,
        trust_remote_code=bool(cfg.trust_remote_code),
        **ref.kwargs(),
    )
    return ImagePlan(plugin, facts, image_token_id(model_config))


def render_images(
    tokenizer: Any, plan: ImagePlan, sample: dict[str, Any], cutoff: int, options: dict[str, Any]
) -> tuple[Rendered, str | None]:
    """One row with images rendered as LLaMA-Factory renders it: each ``<image>`` replaced by its plugin's
    image tokens (their count by the image's size), the template applied, the image tokens out of the
    loss; with why the row cannot train (its image tokens cut), or None. The path ``cockpit check`` and the
    ranks take (:func:`prepare_dataset`); the sample's ``images`` are ``{"path", "size": [w, h]}``."""
    result = render_sample(tokenizer, _with_image_tokens(sample, plan), cutoff, tools=sample.get("tools"), **options)
    return _image_checked(sample, result, plan, cutoff)


def _with_image_tokens(sample: dict[str, Any], plan: ImagePlan) -> list[dict[str, Any]]:
    """The sample's messages with each ``<image>`` replaced by its image's tokens (the plugin's text)."""
    return mm_plugins.expanded(sample["messages"], plan.texts(sample["images"]))


def _image_checked(
    sample: dict[str, Any], result: Rendered, plan: ImagePlan, cutoff: int
) -> tuple[Rendered, str | None]:
    """The rendered row with its image tokens out of the loss, and why it cannot train (or None); each of
    the sample's images gets its ``tokens`` (cockpit check's report reads them)."""
    error = _image_problem(sample, result, plan, cutoff)
    sample["images"] = [{**i, "tokens": plan.tokens(i["size"])} for i in sample["images"]]
    return dataclasses.replace(result, labels=_unlabelled(result, plan.token_id)), error


def _image_problem(sample: dict[str, Any], result: Rendered, plan: ImagePlan, cutoff: int) -> str | None:
    """A rendered row whose image tokens are not all there (cut by cutoff_len, or the tokenizer lacks the token)."""
    counts = [plan.tokens(i["size"]) for i in sample["images"]]
    want, have = sum(counts), result.input_ids.count(plan.token_id)
    if have == want:
        return None
    token = plan.plugin.image_token
    each = f"{counts[0]} tokens" if len(set(counts)) == 1 else f"{'+'.join(map(str, counts))} tokens"
    if want >= cutoff:
        return (
            f"its {want} image tokens ({len(counts)} image(s) of {each}) alone reach cutoff_len "
            f"{cutoff}: a cut image cannot train; raise cutoff_len or give the row fewer images"
        )
    if have == 0 and result.full_length <= cutoff:
        return f"the tokenizer does not read {token} as the model's image token (id {plan.token_id})"
    return (
        f"cutoff_len {cutoff} cuts this row's image tokens: {have} of {want} kept ({len(counts)} image(s) of "
        f"{each}); a cut image cannot train: raise cutoff_len"
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
    to_render = [{**s, "messages": _with_image_tokens(s, plan)} if plan and s.get("images") else s for s in samples]
    rendered: list[Rendered] = []
    kept: list[dict[str, Any]] = []
    problems: list[Problem] = []
    workers = int(cfg.preprocessing_num_workers or 1)
    for sample, (result, error) in zip(samples, render_all(tokenizer, to_render, cutoff, workers, render_options(cfg))):
        if error is not None:  # a template error on one row: reported by its line
            error = f"cannot render with the chat template: {error}"
        elif plan and sample.get("images"):  # render_images' steps, the rendering done in render_all's pool
            result, error = _image_checked(sample, result, plan, cutoff)
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
    return Prepared(loaded, rendered, truncation_report(rendered, cutoff), plan)
