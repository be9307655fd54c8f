"""A vision-language model in the ranks (issue 63): loaded with its image-text head, its parts frozen
as LLaMA-Factory freezes them (:mod:`cockpit.models.vlm`), LoRA on the parts that train, and the
collator that turns each row's images into ``pixel_values`` with the model's own image processor."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cockpit.data import mm_plugins
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
    image tokens in the batch), each regularised as the template's LLaMA-Factory plugin does
    (``image_max_pixels`` / ``image_min_pixels``, then its own resizes) and processed by the model's image
    processor; plus the plugin's other processor outputs (Qwen2-VL: ``image_grid_thw``) and its per-token
    image mark (Qwen2-VL's M-RoPE: ``mm_token_type_ids``), as LLaMA-Factory's collator passes them."""

    def __init__(
        self,
        inner: Callable[[list[dict[str, Any]]], Any],
        image_processor: Any,
        cfg: RunConfig,
        plugin: mm_plugins.ImagePlugin,
        token_id: int,
    ) -> None:
        self.inner = inner
        self.image_processor = image_processor
        self.max_pixels = int(cfg.image_max_pixels)
        self.min_pixels = int(cfg.image_min_pixels)
        self.plugin = plugin
        self.token_id = token_id

    def image_inputs(self, paths: list[str]) -> dict[str, Any]:
        """``pixel_values`` and the plugin's batch keys for these image files."""
        return mm_plugins.image_inputs(self.plugin, self.image_processor, paths, self.max_pixels, self.min_pixels)

    def pixel_values(self, paths: list[str]) -> Any:
        return self.image_inputs(paths)["pixel_values"]

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        paths = [p for f in features for p in f.get("images") or ()]
        batch = self.inner([{k: v for k, v in f.items() if k != "images"} for f in features])
        if paths:
            batch.update(self.image_inputs(paths))
        if self.plugin.token_type_key:
            batch[self.plugin.token_type_key] = (batch["input_ids"] == self.token_id).long()
        return batch


class ModelImages:
    """A vision-language model's view of images when it generates (the image probes, ``do_predict``'s rows), as
    the run's rows were rendered and batched: the template's image plugin (the template the tokenizer renders
    with) turns each ``<image>`` into its image's tokens, and the model folder's image processor gives the batch's
    ``pixel_values`` and the plugin's other keys (:func:`cockpit.data.mm_plugins.image_inputs`), each image
    resized within ``bounds`` (image_max_pixels, image_min_pixels). ``what``/``key``: who asks, for the refusal
    of a text model."""

    def __init__(self, model: Any, tokenizer: Any, bounds: tuple[int, int], what: str, key: str) -> None:
        from cockpit.data.render import lf_template_of

        parts = vlm.composite_of(model.config)
        if parts is None:
            raise InputError(
                Problem(f"{what} need a vision-language model; {model.config.model_type!r} is a text model", key=key)
            )
        named = lf_template_of(tokenizer)
        self.plugin = mm_plugins.plugin_for(named.name if named else None) or mm_plugins.PLUGINS[parts.template]
        self.facts, self.image_processor = mm_plugins.load(self.plugin, model.config.name_or_path, *bounds)
        self.image_id = vlm.image_token_id(model.config)
        self.model = model

    def tokens(self, size: Any) -> int:
        """Image tokens of one image of this size (width, height)."""
        return mm_plugins.image_tokens(self.plugin, self.facts, tuple(size))

    def expanded(self, messages: list[dict[str, Any]], sizes: list[Any]) -> list[dict[str, Any]]:
        """The messages with each ``<image>`` replaced by its image's tokens (``sizes``: the images', in order)."""
        return mm_plugins.expanded(messages, [mm_plugins.image_text(self.plugin, self.facts, tuple(s)) for s in sizes])

    def batch_inputs(self, paths: list[str], ids: Any) -> dict[str, Any]:
        """``pixel_values`` (and the plugin's batch keys) of the batch's images in their order, on the model's
        device and in its dtype; ``ids``: the batch's left-padded input ids (a plugin's token-type mark is read
        from them)."""
        out: dict[str, Any] = {}
        if paths:
            facts = self.facts
            done = mm_plugins.image_inputs(
                self.plugin, self.image_processor, paths, facts.image_max_pixels, facts.image_min_pixels
            )
            param = next(self.model.parameters())
            out = {key: value.to(param.device) for key, value in done.items()}
            out["pixel_values"] = out["pixel_values"].to(dtype=param.dtype)
        if self.plugin.token_type_key:  # as the collator marks every batch
            out[self.plugin.token_type_key] = (ids == self.image_id).long()
        return out


def with_images(collator: Any, cfg: RunConfig, model: Any) -> Any:
    """The collator, wrapped to add the images' inputs when the model is a vision-language model (its
    image processor read from the folder the model was loaded from, as the template's plugin reads it)."""
    parts = parts_of(model)
    if parts is None:
        return collator
    plugin = mm_plugins.PLUGINS[parts.template]
    folder = model.config.name_or_path
    _, image_processor = mm_plugins.load(
        plugin, folder, cfg.image_max_pixels, cfg.image_min_pixels, trust_remote_code=bool(cfg.trust_remote_code)
    )
    return ImageCollator(collator, image_processor, cfg, plugin, vlm.image_token_id(model.config))
