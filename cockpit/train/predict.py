"""``do_predict`` + ``predict_with_generate`` (LLaMA-Factory's prediction): an answer generated for
every prediction sample's prompt (the conversation up to its last assistant turn), written to
``<output_dir>/generated_predictions.jsonl`` as ``{"prompt", "predict", "label"}`` lines, scored by
BLEU-4 / ROUGE-1/2/L (:mod:`cockpit.data.similarity`) into ``predict_results.json``, a ``predict``
event and ``summary.json``'s ``predict``.

Two ways in: after training (:func:`predict_after_training`, the trained adapter, the SFT recipe
calls it on rank 0 only: the other ranks are done by then) and a run that does not train
(:func:`predict_only`, ``do_train: false``: ``adapter_name_or_path`` on the base, one process).
A stop request ends the generation between batches; the samples done are written and scored.

A vision-language model's rows with images (issue 63) generate from their images as the probes do
(:class:`cockpit.train.vlm.ModelImages`: the template's image plugin, ``mm_plugins.image_inputs``); the
prompt column keeps the image tokens, as LLaMA-Factory's ``save_predictions`` decodes them."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cockpit.errors import EXIT_OK, InputError, Problem
from cockpit.store.rundir import atomic_write_json, atomic_write_text
from cockpit.train.progress import probes_reporter, reporter

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig
    from cockpit.train.vlm import ModelImages

PREDICTIONS_FILE = "generated_predictions.jsonl"
RESULTS_FILE = "predict_results.json"
PROGRESS_EVERY_S = 5.0  # predict_progress events at most this often


def split_conversation(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str]:
    """(the prompt: the messages before the last assistant turn, the label: that turn's text, or
    its function calls as JSON when it only calls tools); a conversation without an assistant turn
    is all prompt, with an empty label."""
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        return list(messages), ""
    reply = messages[last]
    label = reply["content"] or (json.dumps(reply["tool_calls"], ensure_ascii=False) if reply.get("tool_calls") else "")
    return list(messages[:last]), label


def prediction_prompt(
    tokenizer: Any, sample: dict[str, Any], cfg: RunConfig, images: ModelImages | None = None
) -> tuple[list[int], str]:
    """(the prompt's token ids, ready for generation; the label): the sample's tools written in as
    training writes them (``tool_format``, the template's own tool list, ``default_system``); a row's
    images (``images``: the model's view of them) as their image tokens, as its rows trained."""
    from cockpit.data.render import render_prompt_ids, with_tools

    messages = sample["messages"]
    if images is not None and sample.get("images"):
        messages = images.expanded(messages, [i["size"] for i in sample["images"]])
    turns, tools = with_tools(tokenizer, messages, sample.get("tools"), cfg.tool_format, cfg.default_system)
    prompt, label = split_conversation(turns)
    return render_prompt_ids(tokenizer, prompt, tools=tools), label


def image_prompt_cut(ids: list[int], sample: dict[str, Any], images: ModelImages | None, cutoff: int) -> list[int]:
    """The prompt's last ``cutoff`` tokens (the generation prompt stays); a row with images must keep every
    image token of its images (a cut image cannot be seen): InputError by the row's file:line otherwise (the cut
    reached them, or an ``<image>`` sits in the answer)."""
    cut = ids[-cutoff:]
    if images is None or not sample.get("images"):
        return cut
    want = sum(images.tokens(i["size"]) for i in sample["images"])
    have = cut.count(images.image_id)
    if have == want:
        return cut
    file, _, line = str(sample.get("source", "")).rpartition(":")
    why = (
        f"its prompt ({len(ids)} tokens) is longer than cutoff_len {cutoff}: the cut keeps {have} of its {want} "
        "image tokens; raise cutoff_len"
        if len(ids) > cutoff
        else f"{want - have} of its {want} image tokens are in the answer: prediction sees the prompt's images only"
    )
    raise InputError(
        Problem(f"cannot predict this row: {why}", file=file or None, line=int(line) if line.isdigit() else None)
    )


def prediction_samples(cfg: RunConfig, tokenizer: Any) -> list[dict[str, Any]]:
    """The samples to predict (config/parity.predict_data_key): ``eval_dataset``; the ``val_size``
    split, the very rows training held out; or all of ``dataset`` in a run that does not train.
    The tokenizer gets the config's chat template on the way."""
    from cockpit.config.parity import predict_data_key
    from cockpit.data.collect import collect_samples
    from cockpit.data.prepare import prepare_dataset
    from cockpit.data.render import apply_template_choice
    from cockpit.train.recipes.base import split_held_out

    apply_template_choice(tokenizer, cfg.template, cfg.default_system, cfg.enable_thinking)
    source = predict_data_key(cfg.mapping())
    if source == "eval_dataset":
        samples = collect_samples(cfg.replace(dataset=cfg.eval_dataset)).samples
    elif source == "val_size":  # as SFT's build_data: samples keeping an assistant token, then the seeded split
        prepared = prepare_dataset(cfg, tokenizer)
        kept = [s for s, r in zip(prepared.loaded.samples, prepared.rendered) if r.target_kept > 0]
        samples = split_held_out(cfg, kept)[1]
    else:
        samples = collect_samples(cfg).samples
    return list(samples)  # each: messages (+ tools)


def generation_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """``model.generate``'s decoding arguments from LLaMA-Factory's generating keys (greedy unless
    ``do_sample``; the model's own sampling defaults are turned off for greedy decoding)."""
    kwargs: dict[str, Any] = {
        "max_new_tokens": int(cfg.max_new_tokens),
        "repetition_penalty": float(cfg.repetition_penalty),
        "do_sample": bool(cfg.do_sample),
    }
    if cfg.do_sample:
        kwargs.update(temperature=float(cfg.temperature), top_p=float(cfg.top_p), top_k=int(cfg.top_k))
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    return kwargs


def generate_predictions(
    model: Any,
    tokenizer: Any,
    samples: list[dict[str, Any]],
    cfg: RunConfig,
    on_progress: Callable[[int, int], None] = lambda done, total: None,
    should_stop: Callable[[], bool] = lambda: False,
) -> tuple[list[dict[str, str]], bool]:
    """(one ``{prompt, predict, label}`` per sample, in order; whether a stop request ended it
    early). Batches of ``per_device_eval_batch_size``; a prompt longer than ``cutoff_len`` keeps
    its last ``cutoff_len`` tokens (the generation prompt stays). A vision-language model's rows with
    images: each ``<image>`` as its image's tokens and the batch's ``pixel_values`` (and the plugin's keys)
    as the probes' (:class:`cockpit.train.vlm.ModelImages`); the prompt column keeps the image tokens, as
    LLaMA-Factory's ``save_predictions`` decodes its input ids."""
    from cockpit.train.generation import generate_new_tokens

    batch, cutoff, decoding = int(cfg.per_device_eval_batch_size), int(cfg.cutoff_len), generation_kwargs(cfg)
    images = row_images(model, tokenizer, samples, cfg)
    rows: list[dict[str, str]] = []
    for start in range(0, len(samples), batch):
        if should_stop():
            return rows, True
        chunk = samples[start : start + batch]
        pairs = [prediction_prompt(tokenizer, sample, cfg, images) for sample in chunk]
        prompts = [image_prompt_cut(ids, sample, images, cutoff) for (ids, _), sample in zip(pairs, chunk)]
        paths = [i["path"] for sample in chunk for i in sample.get("images") or ()]
        seeing = None if images is None else functools.partial(images.batch_inputs, paths)
        answers = generate_new_tokens(model, tokenizer, prompts, batch_inputs=seeing, **decoding)
        for prompt_ids, (_, label), answer_ids in zip(prompts, pairs, answers):
            rows.append(
                {
                    "prompt": tokenizer.decode(prompt_ids, skip_special_tokens=False),
                    "predict": tokenizer.decode(answer_ids, skip_special_tokens=True),
                    "label": label,
                }
            )
        on_progress(len(rows), len(samples))
    return rows, False


def row_images(model: Any, tokenizer: Any, samples: list[dict[str, Any]], cfg: RunConfig) -> ModelImages | None:
    """The model's view of the samples' images (their image_max_pixels / image_min_pixels: the run's), the
    probes' and the collator's; None when no sample has images."""
    if not any(s.get("images") for s in samples):
        return None
    from cockpit.train.vlm import ModelImages

    bounds = (int(cfg.image_max_pixels), int(cfg.image_min_pixels))
    return ModelImages(model, tokenizer, bounds, "predictions from images", "do_predict")


def write_predictions(out_dir: Any, rows: list[dict[str, str]], runtime_s: float, batch: int) -> dict[str, Any]:
    """generated_predictions.jsonl and predict_results.json (LLaMA-Factory's names and keys) in
    ``out_dir``; returns the scores as the ``predict`` event's fields."""
    from cockpit.data.similarity import mean_scores

    out_dir.mkdir(parents=True, exist_ok=True)
    predictions, results = out_dir / PREDICTIONS_FILE, out_dir / RESULTS_FILE
    atomic_write_text(predictions, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), mode=0o644)
    scores = mean_scores((r["predict"], r["label"]) for r in rows)
    runtime = max(runtime_s, 1e-9)
    atomic_write_json(
        results,
        {
            **{f"predict_{name}": value for name, value in scores.items()},
            "predict_runtime": round(runtime_s, 4),
            "predict_samples_per_second": round(len(rows) / runtime, 3),
            "predict_steps_per_second": round(-(-len(rows) // max(batch, 1)) / runtime, 3),
        },
    )
    return {
        "samples": len(rows),
        **{name.replace("-", "_"): value for name, value in scores.items()},
        "runtime_s": round(runtime_s, 2),
        "predictions": str(predictions),
        "results": str(results),
    }


def predict(ctx: Any, model: Any, adapter: str | None) -> dict[str, Any]:
    """Rank 0: generate, write and score this run's predictions; the ``predict`` event. Returns
    its fields (summary.json's ``predict``)."""
    from transformers import set_seed

    cfg, writer = ctx.cfg, ctx.writer
    samples = prediction_samples(cfg, ctx.tokenizer)
    ctx.log(f"predict: {len(samples)} samples ({cfg.max_new_tokens} new tokens at most)")
    progress = reporter(writer, "predict_progress", PROGRESS_EVERY_S)
    set_seed(cfg.seed)  # do_sample: the same predictions for the same seed
    t0 = time.time()
    rows, stopped = generate_predictions(model, ctx.tokenizer, samples, cfg, progress, lambda: ctx.run.consume("stop"))
    fields = write_predictions(ctx.dirs["out"], rows, time.time() - t0, int(cfg.per_device_eval_batch_size))
    fields.update(adapter=adapter, stopped=stopped)
    writer.emit("predict", **fields)
    ctx.log(
        f"predict: {fields['samples']} samples, BLEU-4 {fields['bleu_4']:.2f}, ROUGE-1 {fields['rouge_1']:.2f}, "
        f"ROUGE-2 {fields['rouge_2']:.2f}, ROUGE-L {fields['rouge_l']:.2f} -> {fields['predictions']}"
        + (" (stopped on request)" if stopped else "")
    )
    return fields


def predict_after_training(ctx: Any, attempt: Any, sharded: bool) -> dict[str, Any] | None:
    """Rank 0, after the final save: the trained model's predictions; none after a NaN, a stop, or
    with parameters sharded over the ranks (a DeepSpeed file with ZeRO-3: rank 0 cannot generate alone)."""
    why = (
        "the loss was not finite"
        if attempt.poisoned
        else "training was stopped"
        if attempt.callback.stop_reason is not None
        else "the parameters are sharded over the ranks"
        if sharded
        else None
    )
    if why:
        ctx.log(f"predict: skipped, {why}")
        ctx.writer.emit(
            "alert", level="warn", code="predict_skipped", message=f"do_predict skipped: {why}", remedies=[]
        )
        return None
    return predict(ctx, attempt.trainer.model, str(ctx.dirs["adapter"]))


def predict_only(ctx: Any) -> int:
    """``do_train: false``: the base with ``adapter_name_or_path`` answers the probes (as "after")
    and the prediction samples; summary.json and the run's end, no training step."""
    from cockpit.train.model import build_model
    from cockpit.train.probes import probe_summary, probes_of, run_probes

    cfg = ctx.cfg
    if ctx.rank != 0:  # validation keeps a prediction-only run to one process
        return EXIT_OK
    model = build_model(cfg, ctx.model_ref, ctx.use_cpu, ctx.local_rank)
    if not ctx.use_cpu and not cfg.quantization_bit:  # a quantized model is placed at load
        model = model.to(f"cuda:{ctx.local_rank}")
    ctx.log(f"model loaded with the adapter {cfg.adapter_name_or_path}")
    probes = None
    if cfg.probes:
        asked = probes_of(cfg)
        on_progress = probes_reporter(ctx.writer, "after")
        probes = run_probes(model, ctx.tokenizer, asked, cfg.probe_max_new_tokens, on_progress=on_progress)
        ctx.writer.emit("probe_results", phase="after", **probes)
    fields = predict(ctx, model, cfg.adapter_name_or_path)
    reason = f"stop requested after {fields['samples']} samples" if fields["stopped"] else None
    runtime = round(time.time() - ctx.t0, 2)
    atomic_write_json(
        ctx.run.summary_path,
        {
            "run_id": ctx.run.run_id,
            "state": "stopped" if reason else "finished",
            "reason": reason,
            "steps": 0,
            "total_steps": 0,
            "runtime_s": runtime,
            "tokens_per_s": None,
            "probes_after": probe_summary(probes),
            "adapter_name_or_path": cfg.adapter_name_or_path,
            "predict": fields,
        },
    )
    if reason:
        ctx.writer.emit("run_stopped", reason=reason, step=0)
    else:
        ctx.writer.emit("run_finished", steps=0, runtime_s=runtime, tokens_per_s=None, first_loss=None, last_loss=None)
    return EXIT_OK
