"""Vision-language models as LLaMA-Factory 0.9.5 trains them (issue 63): which models are composite
(a vision tower, a projector, a language model), which of their modules the freeze keys freeze, and
how many ``<image>`` tokens one image becomes. No torch / transformers imports (the planner, and so the
UI, read it; the processor loads in :func:`cockpit.models.resolve.load_processor`).

LLaMA-Factory's ``model_utils/visual.py`` registers each composite model with its projector key,
vision model keys and language model keys (LLaVA: ``multi_modal_projector``, ``vision_tower``,
``language_model`` + ``lm_head``); ``get_forbidden_modules`` freezes, by substring of a parameter's
name, the vision tower (``freeze_vision_tower``, default true), the projector
(``freeze_multi_modal_projector``, default true) and the language model (``freeze_language_model``);
``train_mm_proj_only`` (full fine-tuning only) freezes the tower and the language model and trains the
projector. LoRA's targets leave the frozen parts out (``patch_target_modules``); ``lora_target: all``
never adapts the projector (``find_all_linear_modules``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


@dataclass(frozen=True)
class Composite:
    """A vision-language model's parts, as LLaMA-Factory's ``CompositeModel`` names them."""

    model_type: str
    template: str  # the LLaMA-Factory template whose plugin renders its images (cockpit.data.mm_plugins)
    projector_keys: tuple[str, ...] = ("multi_modal_projector",)
    vision_model_keys: tuple[str, ...] = ("vision_tower",)
    language_model_keys: tuple[str, ...] = ("language_model", "lm_head")
    lora_conflict_keys: tuple[str, ...] = ()  # never adapted by LoRA (LLaMA-Factory's patch_target_modules)
    other_templates: tuple[str, ...] = ()  # more templates with the same image plugin (qwen3_vl_nothink)

    @property
    def templates(self) -> tuple[str, ...]:
        """Every LLaMA-Factory template that renders this model's images."""
        return (self.template, *self.other_templates)


# LLaMA-Factory's model_utils/visual.py registrations; the keys are substrings of transformers 5's parameter
# names (Qwen2-VL: model.visual.patch_embed / .blocks the tower, model.visual.merger the projector,
# model.language_model + lm_head the language model)
_QWEN2_VL_PARTS = dict(
    projector_keys=("visual.merger",),
    vision_model_keys=("visual.patch_embed", "visual.blocks"),
    language_model_keys=("language_model", "lm_head"),
    lora_conflict_keys=("patch_embed",),
)
COMPOSITE: dict[str, Composite] = {
    "llava": Composite("llava", "llava"),
    "qwen2_vl": Composite("qwen2_vl", "qwen2_vl", **_QWEN2_VL_PARTS),  # type: ignore[arg-type]
    "qwen2_5_vl": Composite("qwen2_5_vl", "qwen2_vl", **_QWEN2_VL_PARTS),  # type: ignore[arg-type]
    # Qwen3-VL: model.visual.pos_embed / .patch_embed / .blocks / .deepstack_merger_list the tower (the deepstack
    # mergers count as the tower there, not the projector), model.visual.merger the projector
    "qwen3_vl": Composite(
        "qwen3_vl",
        "qwen3_vl",
        projector_keys=("visual.merger",),
        vision_model_keys=("visual.pos_embed", "visual.patch_embed", "visual.blocks", "visual.deepstack_merger_list"),
        lora_conflict_keys=("patch_embed",),
        other_templates=("qwen3_vl_nothink",),
    ),
    # Gemma 3: LLaMA-Factory's defaults (model.vision_tower, model.multi_modal_projector, model.language_model)
    "gemma3": Composite("gemma3", "gemma3"),
}
VLM_KEYS = ("freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model", "train_mm_proj_only")
# LLaMA-Factory's video frame bounds (its _regularize_videos): no effect on images, and a row with videos is refused
# at check, so on a vision-language model they are provably inert: accepted (its VLM examples set video_max_pixels)
# with a note saying so; on a text model refused as the image keys are
VIDEO_KEYS = ("video_max_pixels", "video_min_pixels")


def composite_of(model_config: Any) -> Composite | None:
    """The model's parts when it is a vision-language model Cockpit trains, else None."""
    return COMPOSITE.get(str(getattr(model_config, "model_type", "") or ""))


def frozen_parts(cfg: RunConfig) -> tuple[str, ...]:
    """Which parts of a vision-language model do not train (``vision``, ``projector``, ``language``):
    LLaMA-Factory's freeze keys with its ``train_mm_proj_only`` rules folded in."""
    frozen = []
    if cfg.freeze_vision_tower or cfg.train_mm_proj_only:
        frozen.append("vision")
    if cfg.freeze_multi_modal_projector and not cfg.train_mm_proj_only:
        frozen.append("projector")
    if cfg.freeze_language_model or cfg.train_mm_proj_only:
        frozen.append("language")
    return tuple(frozen)


def forbidden_modules(cfg: RunConfig, parts: Composite) -> set[str]:
    """LLaMA-Factory's ``get_forbidden_modules``: the name parts whose parameters do not train."""
    keys = {
        "vision": parts.vision_model_keys,
        "projector": parts.projector_keys,
        "language": parts.language_model_keys,
    }
    return {key for part in frozen_parts(cfg) for key in keys[part]}


def lora_targets(cfg: RunConfig, parts: Composite, module_names: list[tuple[str, bool]]) -> list[str]:
    """The modules LoRA adapts (LLaMA-Factory's ``find_all_linear_modules`` + ``patch_target_modules``):
    ``module_names`` are (name, is a linear layer) for every module of the model."""
    frozen = forbidden_modules(cfg, parts) | set(parts.lora_conflict_keys)
    if cfg.lora_target.strip() == "all":
        skip = {"lm_head", *parts.projector_keys} | (set(parts.vision_model_keys) if cfg.freeze_vision_tower else set())
        wanted = {n.rsplit(".", 1)[-1] for n, linear in module_names if linear and not any(s in n for s in skip)}
    else:
        wanted = {t.strip() for t in cfg.lora_target.split(",") if t.strip()}
    return [n for n, _ in module_names if any(t in n for t in wanted) and not any(f in n for f in frozen)]


def model_problems(cfg: RunConfig, model_config: Any) -> list[tuple[str, str]]:
    """(key, why) for each vision-language key that would have no effect with this model and
    ``finetuning_type``: a text model, LoRA's projector, a freeze run's tower."""
    parts = composite_of(model_config)
    from cockpit.config.schema import SCHEMA

    keys = (*VLM_KEYS, "image_max_pixels", "image_min_pixels", *VIDEO_KEYS)
    changed = [k for k in keys if getattr(cfg, k) != SCHEMA[k].default]
    if parts is None:
        model_type = getattr(model_config, "model_type", None)
        return [(k, f"a vision-language model's key, and model type {model_type!r} is a text model") for k in changed]
    problems = []
    if cfg.finetuning_type not in ("lora", "full"):
        problems.append(
            ("finetuning_type", f"{cfg.finetuning_type} with a vision-language model: not built yet (lora or full)")
        )
    if cfg.train_mm_proj_only and cfg.finetuning_type != "full":
        problems.append(
            ("train_mm_proj_only", "trains the projector in full: finetuning_type full only, as in LLaMA-Factory")
        )
    problems += untested_with_vlm(cfg)
    if cfg.finetuning_type == "lora" and not cfg.freeze_multi_modal_projector:
        problems.append(
            (
                "freeze_multi_modal_projector",
                "false has no effect with LoRA (LLaMA-Factory's LoRA never adapts the projector); use finetuning_type full",
            )
        )
    return problems


# What a vision-language model trains on several ranks: (stage, the template's image family) -> the strategies,
# each proven by 2-rank CPU runs in the test suite (tests/test_vlm_strategies.py: LLaVA's sft under DDP, FSDP2 and
# ZeRO-3; tests/test_vlm_strategies_families.py: Qwen2.5-VL's sft under the same three, Qwen2-VL's and LLaVA's dpo
# under DDP, the only strategy the stage runs under; Qwen3-VL's and Gemma 3's sft under the three, the same test).
# "ddp": several ranks, each with the whole model; "zero3": DeepSpeed ZeRO-3; "fsdp": FSDP2 full_shard.
ANY_STRATEGY = ("ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp shard_grad_op", "fsdp hybrid_shard")
PROVEN = ("ddp", "zero3", "fsdp")
SEVERAL_RANKS: dict[tuple[str, str], tuple[str, ...]] = {
    ("sft", "llava"): ANY_STRATEGY,
    ("sft", "qwen2_vl"): PROVEN,
    ("sft", "qwen3_vl"): PROVEN,
    ("sft", "gemma3"): PROVEN,
    ("dpo", "llava"): ("ddp",),
    ("dpo", "qwen2_vl"): ("ddp",),
}


def image_family(template: str | None) -> str:
    """The template's image family: the main template of the composite models it renders (qwen3_vl_nothink:
    qwen3_vl), else the template itself."""
    return next((c.template for c in COMPOSITE.values() if template in c.templates), str(template))


def _zero_stage(cfg: RunConfig) -> int | None:
    """The DeepSpeed ZeRO stage: the generated config's, or the user's file's (a dict in the ranks); None when
    it cannot be read here (check reads the file and refuses it by name)."""
    if not cfg.deepspeed:
        return int(cfg.zero_stage) if cfg.zero_stage else None
    data: Any = cfg.deepspeed
    if not isinstance(data, dict):
        from cockpit.errors import InputError
        from cockpit.strategy.deepspeed import read_file

        try:
            data = read_file(str(data))
        except InputError:
            return None
    stage = (data.get("zero_optimization") or {}).get("stage", 0)
    return int(stage) if isinstance(stage, int) else None


def several_ranks_strategy(cfg: RunConfig) -> tuple[str, str]:
    """(the strategy's name in :data:`SEVERAL_RANKS`, the key that chooses it) of a config on several ranks."""
    if cfg.fsdp:
        extra = sorted(set(str(cfg.fsdp).split()) - {"full_shard", "auto_wrap"})
        return " ".join(["fsdp", *extra]), "fsdp"
    if cfg.deepspeed or cfg.zero_stage:
        return f"zero{_zero_stage(cfg)}", "deepspeed" if cfg.deepspeed else "zero_stage"
    return "ddp", "nproc_per_node"


def _tried_words() -> str:
    """:data:`SEVERAL_RANKS` in words, stage by stage."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (stage, family), strategies in SEVERAL_RANKS.items():
        groups.setdefault((stage, strategies), []).append(family)
    return "tried on several ranks: " + "; ".join(
        f"{stage} with {', '.join(families)} ({'any strategy' if s == ANY_STRATEGY else ', '.join(s)})"
        for (stage, s), families in groups.items()
    )


def untested_with_vlm(cfg: RunConfig) -> list[tuple[str, str]]:
    """(key, why) for what a vision-language model does not train with yet: refused, never tried blind
    (several ranks: :data:`SEVERAL_RANKS`)."""
    why = "with a vision-language model: not built yet (issue 63)"
    out = []
    qlora_several = cfg.world_size > 1 or cfg.sharded  # QLoRA trained: tests/test_vlm_qlora.py
    if cfg.quantization_bit and (qlora_several or cfg.stage != "sft" or cfg.template not in ("llava", "qwen2_vl")):
        where = "on several ranks" if qlora_several else f"in stage {cfg.stage}" if cfg.stage != "sft" else ""
        where = where or f"with template {cfg.template}"
        out.append(("quantization_bit", f"QLoRA {where} {why}; sft with llava or qwen2_vl on one rank only"))
    several = cfg.world_size > 1 or cfg.sharded
    if several:  # trained: SEVERAL_RANKS
        strategy, key = several_ranks_strategy(cfg)
        tried = SEVERAL_RANKS.get((cfg.stage, image_family(cfg.template)))
        if tried is None and cfg.world_size > 1:  # the stage and template on several ranks at all
            key = "nproc_per_node"
        if strategy not in (tried or ()):
            what = f"{cfg.stage} with template {cfg.template} under {strategy}"
            out.append((key, f"{what} with a vision-language model: not in Cockpit's tests yet; {_tried_words()}"))
    if cfg.torch_compile:
        out.append(("torch_compile", f"torch.compile {why}"))
    if cfg.do_predict and (several or cfg.template not in ("llava", "qwen2_vl")):  # tests/test_vlm_predict.py
        where = "on several ranks" if several else f"with template {cfg.template}"
        predicts = "llava's and qwen2_vl's on one rank only"
        out.append(("do_predict", f"prediction (generation from the images) {where} {why}; {predicts}"))
    return out


def video_notes(cfg: RunConfig) -> list[str]:
    """A note for each video key set on a vision-language model: accepted, and inert (see :data:`VIDEO_KEYS`)."""
    from cockpit.config.schema import SCHEMA

    return [
        f"{key} {getattr(cfg, key)}: no effect: it bounds video frames (LLaMA-Factory's _regularize_videos), and "
        "Cockpit trains images only (a row with videos is refused at check)"
        for key in VIDEO_KEYS
        if getattr(cfg, key) != SCHEMA[key].default
    ]


def refuse_unhonoured(cfg: RunConfig, model_config: Any) -> list[str]:
    """InputError naming each vision-language key with no effect on this model (:func:`model_problems`):
    ``cockpit check`` asks it with the model's config, the rank again with the loaded model's. Returns
    the notes on the keys accepted without an effect (:func:`video_notes`)."""
    from cockpit.errors import InputError, Problem

    problems = model_problems(cfg, model_config)
    if problems:
        raise InputError([Problem(why, key=key) for key, why in problems])
    return video_notes(cfg) if composite_of(model_config) else []


def image_seqlen(processor: Any) -> int:
    """How many ``<image>`` tokens one image becomes, as LLaMA-Factory's ``LlavaPlugin`` counts them from a
    processed image's size: its patches, plus ``num_additional_image_tokens`` (CLIP's class token), less
    one when ``vision_feature_select_strategy`` is ``default`` (the class token dropped)."""
    image_processor = processor.image_processor
    crop = getattr(image_processor, "crop_size", None) if getattr(image_processor, "do_center_crop", False) else None
    size = crop or getattr(image_processor, "size", None) or {}
    height, width = size.get("height"), size.get("width")
    if not (height and width):  # a shortest-edge resize without a crop: the count varies by image
        raise ValueError(
            f"{type(image_processor).__name__} resizes by {size} without a crop: its image token count varies per "
            "image, which Cockpit does not count yet"
        )
    patch = int(processor.patch_size)
    seqlen = (int(height) // patch) * (int(width) // patch) + int(getattr(processor, "num_additional_image_tokens", 0))
    return seqlen - 1 if getattr(processor, "vision_feature_select_strategy", "default") == "default" else seqlen


def image_token_id(model_config: Any) -> int:
    """The id the model puts image features at: ``image_token_id`` (Qwen2-VL), else ``image_token_index`` (LLaVA)."""
    value = getattr(model_config, "image_token_id", None)
    return int(value if value is not None else model_config.image_token_index)
