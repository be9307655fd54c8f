"""Golden fixtures of LLaMA-Factory 0.9.5's multimodal rendering (issue 63), made by its own code.

    python bench/lf_mm_fixtures.py            # builds the side venv (bench/lf_venv.py) and re-runs itself there
    python bench/lf_mm_fixtures.py --dry-run  # what it would write, its own inputs checked; no LLaMA-Factory

For each vision-language template of ``FAMILIES`` (llava, qwen2_vl, qwen3_vl, qwen3_vl_nothink, gemma3) and each
row of ``ROWS`` (sharegpt and alpaca rows with 1, 2 and 3 images of different sizes: one with a system message, one
multi-turn with images in two turns), the row goes through LLaMA-Factory's own pipeline: its dataset converter
(``_find_medias`` under ``media_dir``), ``get_template_and_fix_tokenizer``, the supervised processor (its
``mm_plugin.process_messages`` / ``process_token_ids``, ``encode_multiturn``, ``infer_seqlen``) with the
processor as its loader patches it (``patch_processor``: ``image_max_pixels`` / ``image_min_pixels``), then
``mm_plugin.get_mm_inputs`` for the row alone and for all rows in one batch (as its collator calls it); and
``VARIANTS``: a row with ``train_on_prompt``, ``mask_history``, or a cutoff_len that cuts its prompt's end.

The tokenizer is the embedded SmolLM2's with the family's special tokens added (``added_tokens``, in id order);
the image processor is the family's PIL one with small settings (few image tokens per image), its saved form
(``preprocessor_config.json``) recorded whole; the images are generated (``image_pixels``: the same function in
the test) at the sizes of ``IMAGES``: one under ``image_min_pixels`` and one over ``image_max_pixels``, so both
of LLaMA-Factory's resizes run. transformers' Qwen-VL processors want a video processor, which needs
torchvision (not installable with the CPU torch here): those two are built with a stand-in video processor that
only carries ``merge_size`` (no row has a video), and the fixture says so (``processor.stand_in``). The side
venv's Pillow is made the project's first (:func:`same_pillow`): the images are resized by the same code.

Written to ``tests/fixtures/lf_templates/lf_mm_templates.json.gz``: the inputs (rows, images, options, per family
the tokens added, the image processor's config, the processor's settings, the model config's image token ids)
and per template and row LLaMA-Factory's ``input_ids``, ``labels`` and multimodal inputs (each tensor's shape;
``image_grid_thw`` whole; ``pixel_values``' sum and sum of squares; the image positions of ``token_type_ids``). ``tests/test_vlm_lf_parity.py``
rebuilds the same inputs without LLaMA-Factory and compares Cockpit with it.
"""

from __future__ import annotations

import copy
import gzip
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "lf_templates" / "lf_mm_templates.json.gz"

# name -> (width, height, RGB tint): tiny_a is under image_min_pixels (LF scales it up), big_d over
# image_max_pixels (LF scales it down)
IMAGES: dict[str, tuple[int, int, tuple[int, int, int]]] = {
    "tiny_a.png": (40, 24, (220, 40, 40)),
    "square_b.png": (64, 64, (40, 200, 60)),
    "wide_c.png": (96, 48, (30, 60, 210)),
    "big_d.png": (128, 96, (230, 210, 40)),
}
OPTIONS = {"cutoff_len": 1024, "image_max_pixels": 6400, "image_min_pixels": 1024}

_SHAREGPT = {"messages": "messages", "images": "images"}
# name -> (formatting, row)
ROWS: dict[str, tuple[str, dict]] = {
    "one_image": (
        "sharegpt",
        {
            "messages": [
                {"role": "user", "content": "<image>What colour is this?"},
                {"role": "assistant", "content": "It is red."},
            ],
            "images": ["tiny_a.png"],
        },
    ),
    "two_images_system": (
        "sharegpt",
        {
            "messages": [
                {"role": "system", "content": "You describe pictures briefly."},
                {"role": "user", "content": "Compare <image> with <image>, please."},
                {"role": "assistant", "content": "The first is green and square, the second blue and wide."},
            ],
            "images": ["square_b.png", "wide_c.png"],
        },
    ),
    "three_images_multiturn": (
        "sharegpt",
        {
            "messages": [
                {"role": "user", "content": "<image>Name the colour."},
                {"role": "assistant", "content": "Yellow."},
                {"role": "user", "content": "And these two? <image><image>"},
                {"role": "assistant", "content": "Red, then green."},
            ],
            "images": ["big_d.png", "tiny_a.png", "square_b.png"],
        },
    ),
    "alpaca_one_big": (
        "alpaca",
        {
            "instruction": "<image>Describe the image.",
            "input": "",
            "output": "A yellow rectangle.",
            "images": "big_d.png",
        },
    ),
}

# the data options LLaMA-Factory applies to image rows as to text ones: name -> (row, options); "cut" is a
# cutoff_len 3 tokens under the row's length with each template (infer_seqlen cuts the prompt's end, the
# images kept), recorded per template
VARIANTS: dict[str, tuple[str, dict]] = {
    "train_on_prompt": ("two_images_system", {"train_on_prompt": True}),
    "mask_history": ("three_images_multiturn", {"mask_history": True}),
    "cutoff_cuts_the_prompt": ("one_image", {"cutoff_len": "cut"}),
}

_QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]
# family -> its tokens (added as special tokens, in this order), its image processor (transformers class and
# kwargs: small settings) and its processor's settings
FAMILIES: dict[str, dict] = {
    "llava": {
        "tokens": ["<image>"],
        "image_processor": (
            "CLIPImageProcessorPil",
            {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}},
        ),
        "processor": (
            "LlavaProcessor",
            {
                "patch_size": 8,
                "vision_feature_select_strategy": "default",
                "image_token": "<image>",
                "num_additional_image_tokens": 1,
            },
        ),
    },
    "qwen2_vl": {
        "tokens": _QWEN_TOKENS,
        "image_processor": (
            "Qwen2VLImageProcessorPil",
            {
                "patch_size": 14,
                "merge_size": 2,
                "temporal_patch_size": 2,
                "size": {"shortest_edge": 784, "longest_edge": 16384},
            },
        ),
        "processor": ("Qwen2VLProcessor", {}),
    },
    "qwen3_vl": {
        "tokens": [*_QWEN_TOKENS, "<think>", "</think>"],
        "image_processor": (
            "Qwen2VLImageProcessorPil",
            {
                "patch_size": 16,
                "merge_size": 2,
                "temporal_patch_size": 2,
                "size": {"shortest_edge": 1024, "longest_edge": 16384},
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            },
        ),
        "processor": ("Qwen3VLProcessor", {}),
    },
    "gemma3": {
        "tokens": ["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>", "<image_soft_token>"],
        "extra_special_tokens": {
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        "image_processor": ("Gemma3ImageProcessorPil", {"size": {"height": 32, "width": 32}}),
        "processor": ("Gemma3Processor", {"image_seq_length": 4}),
    },
}
# LLaMA-Factory template -> the family whose tokenizer and processor it renders with
TEMPLATES = {
    "llava": "llava",
    "qwen2_vl": "qwen2_vl",
    "qwen3_vl": "qwen3_vl",
    "qwen3_vl_nothink": "qwen3_vl",
    "gemma3": "gemma3",
}


def image_pixels(width: int, height: int, tint: tuple[int, int, int]) -> bytes:
    """An RGB image's bytes, the same on every machine: a gradient over the tint (so a resize changes the
    pixels) -- ``PIL.Image.frombytes("RGB", (width, height), ...)`` makes it here and in the test."""
    r, g, b = tint
    return bytes(
        v
        for y in range(height)
        for x in range(width)
        for v in ((r + 3 * x) % 256, (g + 5 * y) % 256, (b + x * y) % 256)
    )


def write_images(folder: Path) -> None:
    from PIL import Image

    for name, (w, h, tint) in IMAGES.items():
        Image.frombytes("RGB", (w, h), image_pixels(w, h, tint)).save(folder / name)


def _tokenizer_dir() -> str:
    sys.path.insert(0, str(ROOT))
    from cockpit.models.embedded import ensure_embedded_model

    return str(ensure_embedded_model())


def family_tokenizer(tok0, family: str):
    """The embedded tokenizer with the family's tokens added (special, in order); a family with named tokens
    (Gemma 3's boi / eoi / image token) loads it again naming them first (``extra_special_tokens``: a real Gemma 3
    tokenizer_config's), so those take the first new ids."""
    from transformers import AutoTokenizer

    spec = FAMILIES[family]
    extra = spec.get("extra_special_tokens")
    if extra:
        tok = AutoTokenizer.from_pretrained(tok0.name_or_path, use_fast=True, split_special_tokens=False,
                                            padding_side="right", extra_special_tokens=extra)  # fmt: skip
    else:
        tok = copy.deepcopy(tok0)
    tok.add_tokens(spec["tokens"], special_tokens=True)
    return tok


def _stand_in_processor(cls, image_processor, tok, merge_size: int):
    """A transformers Qwen-VL processor whose video processor is a stand-in (no torchvision: the real one cannot
    import); LLaMA-Factory reads only ``video_processor.merge_size`` of it for rows without videos."""
    from types import SimpleNamespace

    class Processor(cls):  # its name keeps "Processor" (LLaMA-Factory's loader drops anything else)
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor":
                return type(argument)
            return super().check_argument_for_proper_class(argument_name, argument)

    Processor.__name__ = cls.__name__
    return Processor(
        image_processor=image_processor, tokenizer=tok, video_processor=SimpleNamespace(merge_size=merge_size)
    )


def family_processor(tok, family: str):
    """The family's processor from its PIL image processor and ``tok``, patched as LLaMA-Factory's loader
    patches it (``patch_processor``); and what the fixture says of it."""
    import transformers
    from llamafactory.hparams import ModelArguments
    from llamafactory.model.patcher import patch_processor

    ip_name, ip_kwargs = FAMILIES[family]["image_processor"]
    image_processor = getattr(transformers, ip_name)(**ip_kwargs)
    name, kwargs = FAMILIES[family]["processor"]
    cls = getattr(transformers, name)
    stand_in = name.startswith("Qwen")
    if stand_in:
        processor = _stand_in_processor(cls, image_processor, tok, image_processor.merge_size)
    else:
        processor = cls(image_processor=image_processor, tokenizer=tok, **kwargs)
    model_args = ModelArguments(
        model_name_or_path="unused",
        image_max_pixels=OPTIONS["image_max_pixels"],
        image_min_pixels=OPTIONS["image_min_pixels"],
    )
    patch_processor(processor, tok, model_args)
    about = {
        "class": name,
        "kwargs": kwargs,
        "image_processor_class": ip_name,
        "image_processor_kwargs": ip_kwargs,
        "preprocessor_config": image_processor.to_dict(),
        "stand_in": "video_processor: a stand-in carrying merge_size only (transformers' needs torchvision)"
        if stand_in
        else None,
    }
    return processor, about


def _example(formatting: str, row: dict, data_args) -> dict:
    from llamafactory.data.converter import get_dataset_converter
    from llamafactory.data.parser import DatasetAttr

    if formatting == "sharegpt":
        attr = DatasetAttr("file", "case", formatting="sharegpt", messages="messages", images="images")
        for key, value in {
            "role_tag": "role",
            "content_tag": "content",
            "user_tag": "user",
            "assistant_tag": "assistant",
            "system_tag": "system",
        }.items():
            setattr(attr, key, value)
    else:
        attr = DatasetAttr(
            "file", "case", formatting="alpaca", prompt="instruction", query="input", response="output", images="images"
        )
    return get_dataset_converter(formatting, attr, data_args)(row)


def _described(mm: dict) -> dict:
    """The multimodal inputs as the fixture keeps them: every tensor's shape, ``image_grid_thw`` whole,
    ``pixel_values``' sum and sum of squares, ``token_type_ids``' image positions per row."""
    out = {}
    for key, value in mm.items():
        if key == "token_type_ids":  # per row, where the image tokens are (the padding's length is the collator's)
            rows = value.tolist() if hasattr(value, "tolist") else value
            out[key] = {"rows": len(rows), "ones": [[i for i, v in enumerate(row) if v] for row in rows]}
            continue
        shape = list(value.shape) if hasattr(value, "shape") else [len(value)]
        entry: dict = {"shape": shape}
        if key == "image_grid_thw":
            entry["values"] = value.tolist()
        if key == "pixel_values":
            entry["sum"] = round(float(value.double().sum()), 6)  # a fingerprint of the pixels: the resizes
            entry["sum_sq"] = round(float(value.double().square().sum()), 6)  # and the normalisation show in it
        out[key] = entry
    return out


def render_template(name: str, tok0, media_dir: str) -> dict:
    """Every row of ``ROWS`` through LLaMA-Factory with template ``name``."""
    from llamafactory.data import template as template_mod
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor
    from llamafactory.hparams import DataArguments

    family = TEMPLATES[name]
    tok = family_tokenizer(tok0, family)
    before = set(tok.get_vocab())
    pristine = copy.deepcopy(template_mod.TEMPLATES[name])
    data_args = DataArguments(template=name, cutoff_len=OPTIONS["cutoff_len"], media_dir=media_dir)
    template = template_mod.get_template_and_fix_tokenizer(tok, data_args)
    template_mod.TEMPLATES[name] = pristine
    processor, about = family_processor(tok, family)
    proc = SupervisedDatasetProcessor(template=template, tokenizer=tok, processor=processor, data_args=data_args)
    rows, batch_images, batch_ids, imglens = {}, [], [], []
    for row_name, (formatting, row) in ROWS.items():
        example = _example(formatting, row, data_args)
        out = proc.preprocess_dataset({k: [v] for k, v in example.items()})
        images = out["images"][0]
        input_ids = out["input_ids"][0]
        mm = template.mm_plugin.get_mm_inputs(images, [], [], [len(images)], [0], [0], [input_ids], processor)
        rows[row_name] = {"input_ids": input_ids, "labels": out["labels"][0], "mm_inputs": _described(mm)}
        batch_images += images
        batch_ids.append(input_ids)
        imglens.append(len(images))
    longest = max(len(ids) for ids in batch_ids)
    padded = [ids + [tok.pad_token_id] * (longest - len(ids)) for ids in batch_ids]  # the collator pads first
    mm = template.mm_plugin.get_mm_inputs(
        batch_images, [], [], imglens, [0] * len(imglens), [0] * len(imglens), padded, processor
    )
    ids = {t: tok.convert_tokens_to_ids(t) for t in FAMILIES[family]["tokens"]}
    variants = {v: _variant(template, tok, processor, data_args, rows, *spec) for v, spec in VARIANTS.items()}
    return {
        "family": family,
        "image_token": template.mm_plugin.image_token,
        "token_ids": ids,
        "template_added_tokens": sorted((t for t in tok.get_vocab() if t not in before), key=tok.convert_tokens_to_ids),
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "vocab_size": len(tok),
        "processor": about,
        "rows": rows,
        "batch_mm_inputs": _described(mm),
        "variants": variants,
    }


def _variant(template, tok, processor, data_args, rows: dict, row_name: str, options: dict) -> dict:
    """One row of ``ROWS`` with LLaMA-Factory's data ``options`` set: its options (the cut's cutoff_len as a
    number), input_ids and labels."""
    from llamafactory.data.processor.supervised import SupervisedDatasetProcessor

    options = dict(options)
    if options.get("cutoff_len") == "cut":
        options["cutoff_len"] = len(rows[row_name]["input_ids"]) - 3
    args = copy.deepcopy(data_args)
    for key, value in options.items():
        setattr(args, key, value)
    proc = SupervisedDatasetProcessor(template=template, tokenizer=tok, processor=processor, data_args=args)
    formatting, row = ROWS[row_name]
    out = proc.preprocess_dataset({k: [v] for k, v in _example(formatting, row, args).items()})
    return {"row": row_name, "options": options, "input_ids": out["input_ids"][0], "labels": out["labels"][0]}


def generate() -> dict:
    import llamafactory
    import PIL
    import torch
    import transformers
    from transformers import AutoTokenizer

    tok0 = AutoTokenizer.from_pretrained(
        _tokenizer_dir(), use_fast=True, split_special_tokens=False, padding_side="right"
    )
    with tempfile.TemporaryDirectory() as media_dir:
        write_images(Path(media_dir))
        templates = {name: render_template(name, tok0, media_dir) for name in TEMPLATES}
    return {
        "llamafactory": llamafactory.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "pillow": PIL.__version__,
        "tokenizer": "the embedded SmolLM2-135M-Instruct's, each family's tokens added (special, in order)",
        "options": OPTIONS,
        "images": {n: {"size": [w, h], "tint": list(t)} for n, (w, h, t) in IMAGES.items()},
        "rows": {n: {"formatting": f, "row": r} for n, (f, r) in ROWS.items()},
        "batch_rows": list(ROWS),  # the rows' order in batch_mm_inputs (the file's keys are sorted)
        "families": {
            f: {k: v for k, v in spec.items() if k != "image_processor" and k != "processor"}
            for f, spec in FAMILIES.items()
        },
        "templates": templates,
    }


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(data, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()
    path.write_bytes(gzip.compress(raw, mtime=0))


def dry_run() -> int:
    """What the run would write and from what, checked short of LLaMA-Factory: the rows' placeholders match
    their images, the images are made, the side venv's command line."""
    sys.path.insert(0, str(ROOT / "bench"))
    import lf_venv

    for name, (_, row) in ROWS.items():
        text = json.dumps(row)
        images = row["images"] if isinstance(row["images"], list) else [row["images"]]
        assert text.count("<image>") == len(images), name
        assert all(i in IMAGES for i in images), name
    with tempfile.TemporaryDirectory() as tmp:
        write_images(Path(tmp))
        made = sorted(p.name for p in Path(tmp).iterdir())
    print(f"{len(TEMPLATES)} templates ({', '.join(TEMPLATES)}), {len(ROWS)} rows, images {', '.join(made)}")
    print(f"would write {OUT.relative_to(ROOT)}")
    import PIL

    return lf_venv.rerun_in_side_venv(__file__, [f"--pillow={PIL.__version__}"], dry_run=True)


def same_pillow(version: str) -> None:
    """The side venv's Pillow made the project's (``--pillow``, before anything imports it): Pillow's bicubic
    resize changed between 11.3 (what LLaMA-Factory's dependencies pull in) and 13.0 (Qwen3-VL's 92x69 -> 96x64
    moves pixel_values' sum by 3e-4), and the fixture is to show Cockpit's resizes, not Pillow's."""
    from importlib.metadata import version as installed

    if installed("pillow") != version:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", f"pillow=={version}"], check=True)


def main() -> int:
    argv = sys.argv[1:]
    if argv == ["--dry-run"]:
        return dry_run()
    pillow = [a.split("=", 1)[1] for a in argv if a.startswith("--pillow=")]
    if len(argv) != len(pillow) or len(pillow) > 1:
        raise SystemExit(f"usage: python {sys.argv[0]} [--dry-run]")
    if importlib.util.find_spec("llamafactory") is None:  # re-run inside the side venv, with this venv's Pillow
        sys.path.insert(0, str(ROOT / "bench"))
        import lf_venv
        import PIL

        return lf_venv.rerun_in_side_venv(__file__, [f"--pillow={PIL.__version__}"])
    if pillow:
        same_pillow(pillow[0])
    data = generate()
    _write(OUT, data)
    print(f"{len(data['templates'])} templates -> {OUT} ({OUT.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
