"""Generation worker for the side-by-side chat: base model vs tuned model of one run.

Started as a subprocess so that the UI process never imports torch::

    python -m cockpit.serve.chat_worker RUN [--runs-dir DIR] [--device cpu|cuda] [--dtype auto|float32|bfloat16|float16]

RUN is a run dir path or a run id (as for every ``cockpit`` command). The worker loads the base
model once and the run's LoRA adapter on top (PEFT); the *base* side is generated with the
adapter disabled, the *tuned* side with it enabled (a full/freeze run: the saved model is the
tuned side, the configured base model the base side). Prompts are rendered with the run's chat
template, exactly as the probes are during training.

Protocol: JSON lines, UTF-8, one object per line. Nothing else is ever written to stdout
(library output goes to stderr, which the caller should send to a log file, not a pipe it
never reads).

In (stdin)::

    {"prompt": "Who are you?"}                       required: prompt (str) or messages
    {"id": 7, "prompt": "...",                       optional: id (echoed back, any JSON value)
     "messages": [{"role": "user", "content": "..."}],  a whole conversation instead of prompt
     "system": "...",                                a system message put before the prompt
     "images": ["/abs/red.png"],                     a vision-language model: the images, one per
                                                     <image> in the text (none there: put before it)
     "sides": ["base", "tuned"],                     which sides, in this order (default both)
     "max_new_tokens": 128,                          default: --max-new-tokens (128)
     "temperature": 0.0}                             0 = greedy (default); > 0 samples
    {"cancel": true}                                 stop the generation in progress
    {"quit": true}                                   exit 0 (so does end of input)

Out (stdout)::

    {"progress": "loading the base model ... on cpu (float32)", "elapsed_s": 2.1}   while loading
    {"ready": true, "run_id": ..., "base_model": ..., "adapter": ..., "device": "cpu",
     "dtype": "float32", "load_s": 1.9, "sides": ["base", "tuned"],
     "model_type": "llava", "reads_images": true}                            once, after the progress
    {"id": 7, "side": "base", "start": true, "prompt_tokens": 9,
     "max_new_tokens": 128}                                                   a side's generation begins
    {"id": 7, "side": "base", "delta": "I am"}                                streamed text pieces
    {"id": 7, "side": "base", "end": true, "text": "...", "token_ids": [...],
     "tokens": 12, "seconds": 0.8, "cancelled": false,
     "cut": false}                                                            once per side; cut: the
                                                                              answer stopped at max_new_tokens
    ... the same for "tuned" ...
    {"id": 7, "done": true, "cancelled": false}                               after all sides
    {"id": 7, "error": "..."}                     a bad request; the worker keeps serving
    {"error": "...", "fatal": true}               cannot start (e.g. no adapter); exit 1

The sides are generated one after the other (one model in memory), base first by default.
Requests are served in order; a request sent while another runs waits for it. The
concatenated deltas of a side equal its "text".
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, TextIO

SIDES = ("base", "tuned")


class Emitter:
    def __init__(self, stream: TextIO):
        self.stream = stream
        self.lock = threading.Lock()

    def __call__(self, **obj: Any) -> None:
        line = json.dumps(obj, ensure_ascii=False)
        with self.lock:
            self.stream.write(line + "\n")
            self.stream.flush()


class Generator:
    """The loaded models and tokenizer of one run; ``generate`` streams one side."""

    def __init__(self, art, device: str = "cpu", dtype: str = "auto", log=lambda *_: None, progress=lambda _: None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from cockpit.data.render import apply_template_choice
        from cockpit.models.resolve import hub_ready, load_tokenizer, resolve_model

        self.torch = torch
        self.art = art
        self.device = device
        cfg = art.config
        if dtype == "auto":
            # as trained: fp32 on the CPU; the run's half precision on a GPU
            tdtype = torch.float32
            if device != "cpu" and (cfg.bf16 or cfg.quantization_bit):
                tdtype = torch.bfloat16
            elif device != "cpu" and cfg.fp16:
                tdtype = torch.float16
        else:
            tdtype = getattr(torch, dtype)
        self.dtype = str(tdtype).replace("torch.", "")
        progress(f"finding the base model {art.base_model}")
        ref = hub_ready(resolve_model(art.base_model, log=log, revision=cfg.model_revision))
        kw = {"trust_remote_code": bool(cfg.trust_remote_code), **ref.model_kwargs()}
        progress("loading the tokenizer")
        if (art.adapter_dir / "tokenizer_config.json").exists():
            self.tok = AutoTokenizer.from_pretrained(str(art.adapter_dir))
        else:
            self.tok = load_tokenizer(cfg, ref, log=log)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        apply_template_choice(self.tok, cfg.template, cfg.default_system, cfg.enable_thinking)
        auto = self._image_reader(cfg, ref, progress) or AutoModelForCausalLM
        progress(f"loading the base model {art.base_model} on {device} ({self.dtype})")
        base = auto.from_pretrained(ref.path, dtype=tdtype, **kw).to(device).eval()
        from cockpit.models.vocab import resize_to_tokenizer

        # rows for the run's added tokens (the adapter holds their weights) or its template's stop words
        resize_to_tokenizer(base, self.tok, mean_resizing=False)
        progress(f"loading the tuned {'adapter' if art.is_lora else 'model'} {art.adapter_dir}")
        if art.is_lora:
            from peft import PeftModel

            self.model = PeftModel.from_pretrained(base, str(art.adapter_dir)).to(device).eval()
            self.base = None
        else:
            self.base = base
            self.model = auto.from_pretrained(str(art.adapter_dir), dtype=tdtype, **kw).to(device).eval()

    def _image_reader(self, cfg: Any, ref: Any, progress) -> Any:
        """A vision-language model (its config's type, :mod:`cockpit.models.vlm`): its template's image plugin,
        the facts it counts image tokens with and its image processor, as the run's rows were rendered and
        collated (:mod:`cockpit.data.mm_plugins`); returns its auto class (None: a text model)."""
        from transformers import AutoConfig

        from cockpit.data import mm_plugins
        from cockpit.models.vlm import composite_of, image_token_id

        model_config = AutoConfig.from_pretrained(
            ref.path, trust_remote_code=bool(cfg.trust_remote_code), **ref.kwargs()
        )
        self.model_type = str(getattr(model_config, "model_type", "") or "")
        self.image_processor: Any = None
        parts = composite_of(model_config)
        if parts is None:
            return None
        progress("loading the image processor")
        self.plugin = mm_plugins.plugin_for(cfg.template) or mm_plugins.PLUGINS[parts.template]
        self.facts, self.image_processor = mm_plugins.load(
            self.plugin,
            ref.path,
            cfg.image_max_pixels,
            cfg.image_min_pixels,
            trust_remote_code=bool(cfg.trust_remote_code),
            **ref.kwargs(),
        )
        self.image_token_id = image_token_id(model_config)
        from transformers import AutoModelForImageTextToText

        return AutoModelForImageTextToText

    def prompt_ids(self, messages: list[dict[str, str]], images: Sequence[str] = ()) -> list[int]:
        """The prompt's ids, rendered with the run's template; with images, each ``<image>`` replaced by its
        image's tokens as the run's rows were (the template's plugin: their count by the image's size)."""
        from cockpit.data import mm_plugins
        from cockpit.data.render import render_prompt_ids

        if images:
            from PIL import Image

            sizes = []
            for path in images:
                with Image.open(path) as image:
                    sizes.append(image.size)
            texts = [mm_plugins.image_text(self.plugin, self.facts, size) for size in sizes]
            messages = mm_plugins.expanded(messages, texts)
        return render_prompt_ids(self.tok, messages)

    def inputs(self, messages: list[dict[str, str]], images: Sequence[str] = ()) -> dict[str, Any]:
        """The model's inputs for one prompt: ``input_ids``, ``attention_mask`` and, with images,
        ``pixel_values`` and the plugin's other keys (each image resized as the run's were, then processed
        by the model's image processor, as the training collator does)."""
        from cockpit.data import mm_plugins

        ids = self.torch.tensor([self.prompt_ids(messages, images)], device=self.device)
        out: dict[str, Any] = {"input_ids": ids, "attention_mask": self.torch.ones_like(ids)}
        if images:
            cfg = self.art.config
            bounds = (int(cfg.image_max_pixels), int(cfg.image_min_pixels))
            done = mm_plugins.image_inputs(self.plugin, self.image_processor, images, *bounds)
            out.update({key: value.to(self.device) for key, value in done.items()})
            out["pixel_values"] = out["pixel_values"].to(dtype=next(self.model.parameters()).dtype)
        if self.image_processor is not None and self.plugin.token_type_key:  # as the collator marks every batch
            out[self.plugin.token_type_key] = (ids == self.image_token_id).long()
        return out

    def generate(
        self, side: str, messages, max_new_tokens: int, temperature: float, cancel: threading.Event, on_delta, images=()
    ):
        """Stream one side; returns (text, token_ids, cancelled, cut): ``cut``, the answer stopped at
        ``max_new_tokens`` (neither its end of sequence nor a cancel). ``images``: paths, one per
        ``<image>`` in the messages (:func:`with_images`)."""
        import contextlib

        from transformers import StoppingCriteria, StoppingCriteriaList, TextIteratorStreamer

        torch = self.torch

        class Cancelled(StoppingCriteria):
            def __call__(self, input_ids, scores, **kwargs):
                return cancel.is_set()

        inputs = self.inputs(messages, images)
        ids = inputs["input_ids"]
        if side == "base" and self.base is None:
            model, ctx = self.model, self.model.disable_adapter()
        elif side == "base":
            model, ctx = self.base, contextlib.nullcontext()
        else:
            model, ctx = self.model, contextlib.nullcontext()
        streamer = TextIteratorStreamer(self.tok, skip_prompt=True, skip_special_tokens=True)
        tok = self.tok
        gen_kw: dict[str, Any] = dict(
            **inputs,
            max_new_tokens=max_new_tokens,
            streamer=streamer,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
            eos_token_id=tok.eos_token_id,
            use_cache=True,
            stopping_criteria=StoppingCriteriaList([Cancelled()]),
        )
        if temperature and temperature > 0:
            gen_kw.update(do_sample=True, temperature=float(temperature), top_p=1.0, top_k=0)
        else:
            gen_kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        result: dict[str, Any] = {}

        def work() -> None:
            try:
                with ctx, torch.no_grad():
                    result["out"] = model.generate(**gen_kw)
            except BaseException as exc:  # noqa: BLE001 - surfaced to the caller below
                result["error"] = exc
                streamer.end()

        th = threading.Thread(target=work, daemon=True)
        th.start()
        text = []
        for piece in streamer:
            if piece:
                text.append(piece)
                on_delta(piece)
        th.join()
        if "error" in result:
            raise result["error"]
        new = result["out"][0, ids.shape[1] :].tolist()
        ended = bool(new) and new[-1] == tok.eos_token_id
        if ended:
            new = new[:-1]
        full = "".join(text)
        cut = not ended and not cancel.is_set() and len(new) >= max_new_tokens
        # the streamer holds back a trailing partial word until the end; it flushed it above
        return full, new, cancel.is_set(), cut


def _messages(req: dict[str, Any]) -> list[dict[str, str]]:
    msgs = req.get("messages")
    if msgs is None:
        prompt = req.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("a request needs 'prompt' (non-empty string) or 'messages'")
        msgs = [{"role": "user", "content": prompt}]
    if not (
        isinstance(msgs, list)
        and msgs
        and all(
            isinstance(m, dict)
            and isinstance(m.get("content"), str)
            and m.get("role") in {"system", "user", "assistant"}
            for m in msgs
        )
    ):
        raise ValueError("'messages' must be a non-empty list of {role: system|user|assistant, content: str}")
    if isinstance(req.get("system"), str) and req["system"] and msgs[0]["role"] != "system":
        msgs = [{"role": "system", "content": req["system"]}, *msgs]
    return msgs


def with_images(gen: Generator, msgs: list[dict[str, str]], images: Any) -> list[dict[str, str]]:
    """The messages for a request's ``images`` (paths): ValueError for a text model, a path that is not a
    file or a count of ``<image>`` that does not match; none in the text: one ``<image>`` per image put
    before the first turn's text (LLaMA-Factory's chat does the same)."""
    from cockpit.data import media

    if gen.image_processor is None:
        if images:
            raise ValueError(f"the model (model type {gen.model_type!r}) is a text model: it reads no images")
        return msgs
    if not (isinstance(images, list) and all(isinstance(p, str) and p for p in images)):
        raise ValueError("'images' must be a list of image file paths")
    missing = [p for p in images if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"no such image file: {', '.join(missing)}")
    turns = [m for m in msgs if m["role"] != "system"]
    if images and not any(media.IMAGE_PLACEHOLDER in m["content"] for m in turns):
        first = msgs.index(turns[0])
        msgs = [*msgs[:first], {**turns[0], "content": media.IMAGE_PLACEHOLDER * len(images) + turns[0]["content"]},
                *msgs[first + 1 :]]  # fmt: skip
    if why := media.placeholder_problem(msgs, len(images), "images"):
        raise ValueError(why)
    return msgs


def serve_loop(gen: Generator, inp: TextIO, emit: Emitter, default_max_new: int) -> int:
    requests: queue.Queue = queue.Queue()
    cancel = threading.Event()

    def reader() -> None:
        for line in inp:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
                if not isinstance(obj, dict):
                    raise ValueError("expected a JSON object")
            except ValueError as exc:
                emit(error=f"bad JSON line: {exc}")
                continue
            if obj.get("cancel"):
                cancel.set()
                continue
            requests.put(obj)
            if obj.get("quit"):
                return
        requests.put({"quit": True})

    threading.Thread(target=reader, daemon=True).start()
    while True:
        req = requests.get()
        if req.get("quit"):
            return 0
        rid = req.get("id")
        cancel.clear()
        try:
            msgs = _messages(req)
            images = req.get("images") or []
            msgs = with_images(gen, msgs, images)  # a VLM's text-only prompt: no <image> in it either
            sides = req.get("sides") or list(SIDES)
            if not (isinstance(sides, list) and sides and all(s in SIDES for s in sides)):
                raise ValueError("'sides' must be a list of 'base' and/or 'tuned'")
            max_new = int(req.get("max_new_tokens") or default_max_new)
            if not 1 <= max_new <= 8192:
                raise ValueError("'max_new_tokens' must be within 1..8192")
            temperature = float(req.get("temperature") or 0.0)
        except (ValueError, TypeError) as exc:
            emit(id=rid, error=str(exc))
            continue
        cancelled = False
        try:
            for side in sides:
                if cancel.is_set():
                    cancelled = True
                    break
                t0 = time.perf_counter()
                prompt_tokens = len(gen.prompt_ids(msgs, images))
                emit(id=rid, side=side, start=True, prompt_tokens=prompt_tokens, max_new_tokens=max_new)
                text, ids, was_cancelled, cut = gen.generate(
                    side,
                    msgs,
                    max_new,
                    temperature,
                    cancel,
                    lambda d, side=side, rid=rid: emit(id=rid, side=side, delta=d),
                    images,
                )
                emit(
                    id=rid,
                    side=side,
                    end=True,
                    text=text,
                    token_ids=ids,
                    tokens=len(ids),
                    seconds=round(time.perf_counter() - t0, 3),
                    cancelled=was_cancelled,
                    cut=cut,
                )
                cancelled = cancelled or was_cancelled
        except Exception as exc:  # noqa: BLE001 - a generation failure ends this request, not the worker
            emit(id=rid, error=f"generation failed: {type(exc).__name__}: {exc}")
            continue
        emit(id=rid, done=True, cancelled=cancelled)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m cockpit.serve.chat_worker", description="base vs tuned generation, JSON lines on stdin/stdout"
    )
    p.add_argument("run")
    p.add_argument("--runs-dir", default=None)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda when available, else cpu)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--max-new-tokens", type=int, default=128)
    args = p.parse_args(argv)
    out = sys.stdout
    sys.stdout = sys.stderr  # only protocol lines on the real stdout
    emit = Emitter(out)
    for k, v in {
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TOKENIZERS_PARALLELISM": "false",
    }.items():
        os.environ.setdefault(k, v)
    from cockpit.errors import InputError
    from cockpit.serve.artifacts import load_run
    from cockpit.store.rundir import default_runs_dir, resolve_run

    t0 = time.perf_counter()

    def progress(what: str) -> None:
        emit(progress=what, elapsed_s=round(time.perf_counter() - t0, 1))

    try:
        art = load_run(resolve_run(args.run, args.runs_dir or default_runs_dir()))
        progress("importing torch and transformers")
        import torch

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        gen = Generator(
            art, device=device, dtype=args.dtype, log=lambda m: print(m, file=sys.stderr), progress=progress
        )
    except (LookupError, InputError) as exc:
        emit(error=str(exc), fatal=True)
        return 1
    except Exception as exc:  # noqa: BLE001 - any load failure is reported to the UI as fatal
        emit(error=f"cannot load the models: {type(exc).__name__}: {exc}", fatal=True)
        return 1
    emit(
        ready=True,
        run_id=art.run_id,
        base_model=art.base_model,
        adapter=str(art.adapter_dir),
        device=device,
        dtype=gen.dtype,
        load_s=round(time.perf_counter() - t0, 2),
        sides=list(SIDES),
        model_type=gen.model_type,
        reads_images=gen.image_processor is not None,
    )
    return serve_loop(gen, sys.stdin, emit, args.max_new_tokens)


if __name__ == "__main__":
    sys.exit(main())
