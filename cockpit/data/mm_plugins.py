"""Image plugins: how each vision-language template turns one image into tokens, as LLaMA-Factory 0.9.5's
``mm_plugin`` does (issue 63). No torch at import (transformers and Pillow load inside the functions).

One registry, :data:`PLUGINS`, keyed by the config's ``template``. An :class:`ImagePlugin` holds:

- ``text_template``: the LLaMA-Factory text template whose slots the rows render with (LLaVA: vicuna's);
- ``image_token``: the token the image's features go to (LLaMA-Factory's ``image_token`` of the template);
- ``count``: how many image tokens one image of a given regularised size becomes (:class:`ImageFacts` read
  from the model folder's processor files);
- ``wrap``: the text that replaces the image's ``<image>`` placeholder, given that count (LLaVA: the image
  token ``count`` times; Qwen2-VL: ``<|vision_start|>`` + ``<|image_pad|>`` × count + ``<|vision_end|>``);
- ``extra_steps``: the plugin's own resizes after LLaMA-Factory's ``image_max_pixels`` / ``image_min_pixels``
  (its ``_preprocess_image`` override; Qwen2-VL: at least 28 px a side, aspect at most 200);
- ``batch_keys``: the image processor's outputs the batch carries besides ``pixel_values`` (Qwen2-VL:
  ``image_grid_thw``); ``token_type_key``: a per-token key marking the image tokens with 1, built from
  ``input_ids`` in the collator (Qwen2-VL's M-RoPE: ``mm_token_type_ids``; Gemma 3: ``token_type_ids``);
- ``load``: ``(folder, **from_pretrained kwargs) -> (ImageFacts, image processor)``, read without
  ``AutoProcessor`` (transformers 5's Qwen-VL processors want a video processor, so torchvision): the
  image processor's PIL backend, which needs no torchvision and gives the same token counts.

To add a family: write its ``count`` (and ``wrap`` / ``load`` if LLaVA's or Qwen2-VL's do not fit), add one
``ImagePlugin`` entry to :data:`PLUGINS`, and its model types to ``cockpit.models.vlm.COMPOSITE`` (the parts
the freeze keys name, with ``template`` = the entry's key). ``cockpit.data.prepare.render_images`` then
renders its rows and the collator feeds its images.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

Size = tuple[int, int]  # (width, height), as Pillow gives it


@dataclass(frozen=True)
class ImageFacts:
    """What counting an image's tokens reads from the model folder's processor files, plus the config's
    ``image_max_pixels`` / ``image_min_pixels`` (LLaMA-Factory sets them on the processor)."""

    image_max_pixels: int = 768 * 768
    image_min_pixels: int = 32 * 32
    seqlen: int = 0  # a fixed count per image (LLaVA)
    patch_size: int = 0  # Qwen2-VL: the vision patch, the merge of merge_size² patches into one token,
    merge_size: int = 1  # and the image processor's own pixel bounds (its smart_resize)
    min_pixels: int = 0
    max_pixels: int = 0


@dataclass(frozen=True)
class ImagePlugin:
    """One template's images, as its LLaMA-Factory ``mm_plugin`` renders them (see the module's doc)."""

    name: str
    text_template: str
    image_token: str
    count: Callable[[ImageFacts, Size], int]
    wrap: Callable[[ImagePlugin, int], str]
    load: Callable[..., tuple[ImageFacts, Any]]
    extra_steps: tuple[Callable[[int, int], Size], ...] = ()
    batch_keys: tuple[str, ...] = ()
    token_type_key: str | None = None
    vision_start: str = field(default="", compare=False)
    vision_end: str = field(default="", compare=False)


# -- sizes: LLaMA-Factory's _preprocess_image ---------------------------------------------------------------


def _scaled(size: Size, pixels: int) -> Size:
    factor = math.sqrt(pixels / (size[0] * size[1]))
    return int(size[0] * factor), int(size[1] * factor)


def base_steps(size: Size, max_pixels: int, min_pixels: int) -> list[Size]:
    """The sizes LLaMA-Factory's base ``_preprocess_image`` resizes to, in order (none: kept as is)."""
    steps = []
    if size[0] * size[1] > max_pixels:
        size = _scaled(size, max_pixels)
        steps.append(size)
    if size[0] * size[1] < min_pixels:
        steps.append(_scaled(size, min_pixels))
    return steps


def resize_steps(plugin: ImagePlugin, size: Size, max_pixels: int, min_pixels: int) -> list[Size]:
    """Every resize the plugin's ``_preprocess_image`` makes, in order: the base ones, then its own."""
    steps = base_steps(size, max_pixels, min_pixels)
    current = steps[-1] if steps else size
    for step in plugin.extra_steps:
        new = step(*current)
        if new != current:
            steps.append(new)
            current = new
    return steps


def regularized_size(plugin: ImagePlugin, size: Size, max_pixels: int, min_pixels: int) -> Size:
    """The image's size when the processor gets it."""
    steps = resize_steps(plugin, tuple(size), max_pixels, min_pixels)  # type: ignore[arg-type]
    return steps[-1] if steps else (int(size[0]), int(size[1]))


def regularized(plugin: ImagePlugin, path: str, max_pixels: int, min_pixels: int) -> Any:
    """The image file as LLaMA-Factory hands it to the processor: each resize of :func:`resize_steps`
    made in turn (Pillow's default resampling, as there), then RGB."""
    from PIL import Image

    image: Image.Image = Image.open(path)
    image.load()
    for size in resize_steps(plugin, image.size, max_pixels, min_pixels):
        image = image.resize(size)
    return image.convert("RGB") if image.mode != "RGB" else image


def image_inputs(
    plugin: ImagePlugin, image_processor: Any, paths: Sequence[str], max_pixels: int, min_pixels: int
) -> dict[str, Any]:
    """``pixel_values`` and the plugin's batch keys for these image files, each :func:`regularized` then
    processed by the model's image processor (the training collator, the probes and the chat alike)."""
    images = [regularized(plugin, p, max_pixels, min_pixels) for p in paths]
    out = image_processor(images, return_tensors="pt")
    return {key: out[key] for key in ("pixel_values", *plugin.batch_keys)}


def image_tokens(plugin: ImagePlugin, facts: ImageFacts, size: Size) -> int:
    """How many image tokens one image of this (original) size becomes."""
    return plugin.count(facts, regularized_size(plugin, size, facts.image_max_pixels, facts.image_min_pixels))


def image_text(plugin: ImagePlugin, facts: ImageFacts, size: Size) -> str:
    """The text that replaces the image's ``<image>`` placeholder."""
    return plugin.wrap(plugin, image_tokens(plugin, facts, size))


# -- LLaVA: a fixed count ------------------------------------------------------------------------------------


def _llava_count(facts: ImageFacts, size: Size) -> int:
    return facts.seqlen


def _repeat(plugin: ImagePlugin, count: int) -> str:
    return plugin.image_token * count


def _load_llava(folder: str, **kwargs: Any) -> tuple[ImageFacts, Any]:
    """LlavaProcessor (its image processor needs no torchvision): the fixed count from its settings."""
    from transformers import AutoProcessor

    from cockpit.models.vlm import image_seqlen

    processor = AutoProcessor.from_pretrained(folder, **kwargs)
    return ImageFacts(seqlen=image_seqlen(processor)), processor.image_processor


# -- Qwen2-VL / Qwen2.5-VL: a count by size --------------------------------------------------------------------


def _at_least_28(width: int, height: int) -> Size:
    return (max(width, 28), max(height, 28)) if min(width, height) < 28 else (width, height)


def _not_too_wide(width: int, height: int) -> Size:
    return (height * 180, height) if width / height > 200 else (width, height)


def _not_too_tall(width: int, height: int) -> Size:
    return (width, width * 180) if height / width > 200 else (width, height)


def grid_thw(facts: ImageFacts, size: Size) -> tuple[int, int, int]:
    """Qwen2-VL's image processor's ``image_grid_thw`` for one image of this (regularised) size: its
    ``smart_resize`` to a multiple of patch_size × merge_size within its own pixel bounds, in patches."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

    width, height = size
    factor = facts.patch_size * facts.merge_size
    h, w = smart_resize(height, width, factor=factor, min_pixels=facts.min_pixels, max_pixels=facts.max_pixels)
    return 1, h // facts.patch_size, w // facts.patch_size


def _qwen2_vl_count(facts: ImageFacts, size: Size) -> int:
    t, h, w = grid_thw(facts, size)
    return t * h * w // (facts.merge_size**2)


def _vision_wrapped(plugin: ImagePlugin, count: int) -> str:
    return f"{plugin.vision_start}{plugin.image_token * count}{plugin.vision_end}"


def _size_bounds(image_processor: Any) -> tuple[int, int]:
    """(min_pixels, max_pixels) of a Qwen2-VL image processor: ``size``'s shortest_edge / longest_edge
    (transformers 5), else its min_pixels / max_pixels (older saved configs)."""
    size = getattr(image_processor, "size", None)
    get = size.get if isinstance(size, Mapping) else (lambda k: getattr(size, k, None))
    low = get("shortest_edge") or get("min_pixels") or getattr(image_processor, "min_pixels", None)
    high = get("longest_edge") or get("max_pixels") or getattr(image_processor, "max_pixels", None)
    if not (low and high):
        raise ValueError(f"{type(image_processor).__name__} names no pixel bounds (size {size})")
    return int(low), int(high)


def load_pil_image_processor(folder: str, **kwargs: Any) -> Any:
    """The folder's image processor, its PIL backend (no torchvision needed, installed or not)."""
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(folder, backend="pil", **kwargs)


def _load_qwen2_vl(folder: str, **kwargs: Any) -> tuple[ImageFacts, Any]:
    image_processor = load_pil_image_processor(folder, **kwargs)
    low, high = _size_bounds(image_processor)
    patch, merge = int(image_processor.patch_size), int(image_processor.merge_size)
    return ImageFacts(patch_size=patch, merge_size=merge, min_pixels=low, max_pixels=high), image_processor


PLUGINS: dict[str, ImagePlugin] = {
    "llava": ImagePlugin("llava", "vicuna", "<image>", _llava_count, _repeat, _load_llava),
    "qwen2_vl": ImagePlugin(
        "qwen2_vl",
        "qwen2_vl",
        "<|image_pad|>",
        _qwen2_vl_count,
        _vision_wrapped,
        _load_qwen2_vl,
        extra_steps=(_at_least_28, _not_too_wide, _not_too_tall),
        batch_keys=("image_grid_thw",),
        token_type_key="mm_token_type_ids",
        vision_start="<|vision_start|>",
        vision_end="<|vision_end|>",
    ),
}


# -- Qwen3-VL: Qwen2-VL's images --------------------------------------------------------------------------------
# LLaMA-Factory's Qwen3VLPlugin subclasses Qwen2VLPlugin and overrides only the video side (timestamps per frame,
# its video smart_resize, the video processor): an image is Qwen2-VL's, the grid by its processor's own patch_size
# (16 in Qwen3-VL's preprocessor_config.json, read by _load_qwen2_vl). Its templates' text slots are qwen3's and
# qwen3_nothink's, field for field (template.py: "copied from qwen template").
PLUGINS["qwen3_vl"] = replace(PLUGINS["qwen2_vl"], name="qwen3_vl", text_template="qwen3")
PLUGINS["qwen3_vl_nothink"] = replace(PLUGINS["qwen2_vl"], name="qwen3_vl_nothink", text_template="qwen3_nothink")


# -- Gemma 3: a fixed count between boi and eoi -------------------------------------------------------------------


def _load_gemma3(folder: str, **kwargs: Any) -> tuple[ImageFacts, Any]:
    """Gemma3Processor's ``image_seq_length`` (its ``full_image_sequence`` repeats the image token that many
    times; AutoProcessor: Gemma 3's needs no torchvision) and the image processor's PIL backend."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(folder, **kwargs)
    return ImageFacts(seqlen=int(processor.image_seq_length)), load_pil_image_processor(folder, **kwargs)


# LLaMA-Factory's Gemma3Plugin: each <image> becomes the processor's full_image_sequence, "\n\n<start_of_image>"
# + <image_soft_token> x image_seq_length + "<end_of_image>\n\n"; token_type_ids mark the image tokens (its
# _get_gemma3_token_type_ids); the text slots are the gemma template's (gemma3's are the same, field for field).
# Pan-and-scan (image_do_pan_and_scan) is refused by name at check.
PLUGINS["gemma3"] = ImagePlugin(
    "gemma3",
    "gemma",
    "<image_soft_token>",
    _llava_count,
    _vision_wrapped,
    _load_gemma3,
    token_type_key="token_type_ids",
    vision_start="\n\n<start_of_image>",
    vision_end="<end_of_image>\n\n",
)


# the text slots of the image templates that LLaMA-Factory registers with slots of their own (its template.py;
# the text templates' data, cockpit.data.lf_templates, leaves the multimodal ones out): qwen2_vl is "copied from
# qwen template" with its own default system
IMAGE_TEXT_TEMPLATES: dict[str, dict[str, Any]] = {
    "qwen2_vl": {"like": "qwen", "default_system": "You are a helpful assistant."},
}


def plugin_for(template: str | None) -> ImagePlugin | None:
    """The config template's image plugin (None: the template renders text only)."""
    return PLUGINS.get(template or "")


def load(plugin: ImagePlugin, folder: str, max_pixels: int, min_pixels: int, **kwargs: Any) -> tuple[ImageFacts, Any]:
    """The plugin's facts from the model folder (with the config's image_max/min_pixels) and its image processor."""
    facts, image_processor = plugin.load(folder, **kwargs)
    return replace(facts, image_max_pixels=int(max_pixels), image_min_pixels=int(min_pixels)), image_processor


def expanded(messages: Sequence[Mapping[str, Any]], texts: Sequence[str], placeholder: str = "<image>") -> list[dict]:
    """The messages with their ``<image>`` placeholders replaced in order, the i-th by ``texts[i]``
    (LLaMA-Factory's ``process_messages``; a system message keeps its text as there, where it is no turn)."""
    queue = list(texts)
    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str) and m.get("role") != "system":
            parts = content.split(placeholder)
            pieces = [parts[0]]
            for part in parts[1:]:
                pieces += [queue.pop(0) if queue else placeholder, part]
            out.append({**m, "content": "".join(pieces)})
        else:
            out.append(dict(m))
    return out
