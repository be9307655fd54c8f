"""A vision-language model in the ranks (issue 63): loaded with its image-text head, its parts frozen
as LLaMA-Factory freezes them (:mod:`cockpit.models.vlm`), LoRA on the parts that train, and the
collator that turns each row's images into ``pixel_values`` with the model's own image processor."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cockpit.data import media
from cockpit.errors import InputError, Problem
from cockpit.models import vlm

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig
    from cockpit.models.resolve import ModelRef


def parts_of(model: Any) -> vlm.Composite | None:
    """The model's parts when it is a vision-language model (its config names the type)."""
    return vlm.composite_of(getattr(model, "config", None))


def load_base(ref: ModelRef, kwargs: dict[str, Any]) -> Any:
    """The vision-language model from its folder (``AutoModelForImageTextToText``: LLaVA's
    ``LlavaForConditionalGeneration``)."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(ref.path, **kwargs)


def freeze_parts(model: Any, cfg: RunConfig, parts: vlm.Composite) -> None:
    """Full fine-tuning: the parameters of the frozen parts do not train (LLaMA-Factory's ``_setup_full_tuning``)."""
    frozen = vlm.forbidden_modules(cfg, parts)
    for name, param in model.named_parameters():
        if any(part in name for part in frozen):
            param.requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        raise InputError(Problem("every part of the model is frozen: nothing trains", key="freeze_language_model"))


def lora_target_names(model: Any, cfg: RunConfig, parts: vlm.Composite) -> list[str]:
    """The full names of the modules LoRA adapts (:func:`cockpit.models.vlm.lora_targets`)."""
    import torch

    modules = [(name, isinstance(m, torch.nn.Linear)) for name, m in model.named_modules() if name]
    names = vlm.lora_targets(cfg, parts, modules)
    if not names:
        raise InputError(
            Problem(
                f"no module of the parts that train matches {cfg.lora_target!r} (the frozen parts are left out)",
                key="lora_target",
            )
        )
    return names


class ImageCollator:
    """The text collator's batch plus ``pixel_values``: every row's images in order (the order of their
    image tokens in the batch), each regularised as LLaMA-Factory does (``image_max_pixels`` /
    ``image_min_pixels``) and processed by the model's image processor."""

    def __init__(self, inner: Callable[[list[dict[str, Any]]], Any], image_processor: Any, cfg: RunConfig) -> None:
        self.inner = inner
        self.image_processor = image_processor
        self.max_pixels = int(cfg.image_max_pixels)
        self.min_pixels = int(cfg.image_min_pixels)

    def pixel_values(self, paths: list[str]) -> Any:
        images = [media.regularized(p, self.max_pixels, self.min_pixels) for p in paths]
        return self.image_processor(images, return_tensors="pt")["pixel_values"]

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        paths = [p for f in features for p in f.get("images") or ()]
        batch = self.inner([{k: v for k, v in f.items() if k != "images"} for f in features])
        if paths:
            batch["pixel_values"] = self.pixel_values(paths)
        return batch


def with_images(collator: Any, cfg: RunConfig, model: Any) -> Any:
    """The collator, wrapped to add ``pixel_values`` when the model is a vision-language model (its
    processor read from the folder the model was loaded from)."""
    if parts_of(model) is None:
        return collator
    from transformers import AutoProcessor

    folder = model.config.name_or_path
    processor = AutoProcessor.from_pretrained(folder, trust_remote_code=bool(cfg.trust_remote_code))
    return ImageCollator(collator, processor.image_processor, cfg)
