"""The embedded vision-language demo model (issue 63): the embedded SmolLM2-135M-Instruct's real weights as
the language model of a LLaVA (``LlavaForConditionalGeneration``: Llama language model + vision tower +
projector), with a small CLIP vision tower and LLaVA's projector, both randomly initialised: they learn to
see in ``presets/cpu-vlm-demo.yaml``. ``<image>`` is added to the tokenizer, and a ``LlavaProcessor`` is saved
with CLIP's PIL image processor (no torchvision). Built once into a cached folder beside the embedded model's,
atomically, as the embedded model is converted (:func:`cockpit.models.embedded.build_once`)."""

from __future__ import annotations

from pathlib import Path

from cockpit.models.embedded import build_once, ensure_embedded_model
from cockpit.store.rundir import cache_dir

VLM_NAMES = {"smollm2-135m-vlm", "embedded-vlm"}
CACHE_NAME = "smollm2-135m-vlm-v3"  # the version: a change of the recipe below builds a new folder
IMAGE_SIZE = 32  # px, square: the demo's images are drawn this size
PATCH = 16  # 2x2 patches, a quadrant each: 4 image tokens per image (CLIP's class token dropped, strategy "default")
VISION = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4)
SEED = 0


def is_embedded_vlm(name: str | None) -> bool:
    return bool(name) and name.strip().lower() in VLM_NAMES


def embedded_vlm_dir() -> Path:
    return cache_dir() / "models" / CACHE_NAME


def _is_complete(folder: Path) -> bool:
    return all(
        (folder / f).exists() for f in ("model.safetensors", "config.json", "processor_config.json", "tokenizer.json")
    )


def ensure_embedded_vlm(log=print) -> Path:
    """The built folder, building it (from the embedded model, itself converted first when missing) when missing."""
    lm = ensure_embedded_model(log=log)
    return build_once(
        embedded_vlm_dir(), _is_complete, lambda tmp: build_vlm(lm, tmp), log, "building the embedded VLM"
    )


def build_vlm(lm_dir: Path, out: Path) -> None:
    """SmolLM2 (from ``lm_dir``) as the language model of a LLaVA with a fresh CLIP tower and projector."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = AutoTokenizer.from_pretrained(str(lm_dir))
    tok.add_tokens(["<image>"], special_tokens=True)
    lm = AutoModelForCausalLM.from_pretrained(str(lm_dir), dtype=torch.float32)
    vision = CLIPVisionConfig(image_size=IMAGE_SIZE, patch_size=PATCH, **VISION)
    cfg = LlavaConfig(
        text_config=lm.config,
        vision_config=vision,
        image_token_index=tok.convert_tokens_to_ids("<image>"),
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        tie_word_embeddings=lm.config.tie_word_embeddings,
    )
    torch.manual_seed(SEED)
    model = LlavaForConditionalGeneration(cfg)
    missing = model.model.language_model.load_state_dict(lm.model.state_dict(), strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys, missing
    model.lm_head.load_state_dict(lm.lm_head.state_dict())
    model.resize_token_embeddings(len(tok))  # the <image> row: its embedding is replaced by image features
    model.generation_config = lm.generation_config
    model.to(torch.bfloat16).save_pretrained(out)  # the embedded model's dtype
    images = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE}
    )
    LlavaProcessor(
        image_processor=images,
        tokenizer=tok,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        image_token="<image>",
        num_additional_image_tokens=1,
    ).save_pretrained(out)
