"""Parameter counts: from the real model built on the meta device, with an analytic fallback.

``count_params`` builds ``AutoModelForCausalLM.from_config(model_config)`` under ``torch.device("meta")``
(no memory, no weights) and sorts the parameters into embedding / lm_head / decoder layers /
the rest, and the layers' ``nn.Linear`` weights (what bitsandbytes quantizes). If torch or
transformers are missing or do not know the architecture, the same numbers come from the
config alone (Llama-family layout: SwiGLU MLP, GQA attention, RMSNorm).

``count_lora`` runs the real PEFT ``get_peft_model`` on a one-layer meta model (every decoder
layer has the same shapes, so per-layer LoRA numbers times the layer count is exact), else
r * (in + out) per target module.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cockpit.models.lm_head import scaled_by
from cockpit.plan.vlm_counts import QKV_BIAS_TYPES, composite_params, layer_norms

# module name -> (in_features, out_features) as functions of the config numbers
LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Dims:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    qkv_bias: bool
    model_type: str
    logits_scaled_by: str | None = None  # a config key that scales the logits before the loss (models.lm_head)
    # a mixture-of-experts model (cockpit.models.moe): routed experts per layer, the top-k a token goes
    # to, one expert's width and the always-on shared experts; 0 for a dense model
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_experts: int = 0
    head_type: str | None = None  # a LLaVA's own type: its LM head is the wrapper's (models.lm_head's rule)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


def dims_of(model_config: Mapping[str, Any]) -> Dims:
    h = int(model_config["hidden_size"])
    a = int(model_config["num_attention_heads"])
    hd = model_config.get("head_dim") or h // a
    mt = str(model_config.get("model_type", "llama"))
    from cockpit.models.moe import experts_of

    moe = experts_of(model_config)
    return Dims(
        hidden=h,
        intermediate=int(model_config["intermediate_size"]),
        layers=int(model_config["num_hidden_layers"]),
        heads=a,
        kv_heads=int(model_config.get("num_key_value_heads") or a),
        head_dim=int(hd),
        vocab=int(model_config["vocab_size"]),
        tied=bool(model_config.get("tie_word_embeddings", False)),
        qkv_bias=bool(model_config.get("attention_bias", False)) or mt in QKV_BIAS_TYPES,
        model_type=mt,
        logits_scaled_by=scaled_by(model_config),
        experts=moe.routed if moe else 0,
        top_k=moe.top_k if moe else 0,
        expert_intermediate=int(model_config.get("moe_intermediate_size") or model_config["intermediate_size"])
        if moe
        else 0,
        shared_experts=moe.shared if moe else 0,
        head_type=model_config.get("_vlm_type"),
    )


def linear_shapes(d: Dims) -> dict[str, tuple[int, int]]:
    """(in, out) of each decoder-layer linear, Llama/Qwen2/Mistral layout."""
    return {
        "q_proj": (d.hidden, d.q_dim),
        "k_proj": (d.hidden, d.kv_dim),
        "v_proj": (d.hidden, d.kv_dim),
        "o_proj": (d.q_dim, d.hidden),
        "gate_proj": (d.hidden, d.intermediate),
        "up_proj": (d.hidden, d.intermediate),
        "down_proj": (d.intermediate, d.hidden),
    }


@dataclass(frozen=True)
class ParamCounts:
    total: int  # unique parameters (tied embeddings once)
    embedding: int  # embed_tokens
    lm_head: int  # 0 when tied
    per_layer: int  # one decoder layer, everything
    layer_linear: int  # one decoder layer, nn.Linear weights only (quantizable)
    layers: int
    other: int  # final norm etc.
    max_linear: int  # the largest single linear weight (dequantize buffer)
    linear_names: tuple[str, ...] = field(default=LLAMA_LINEARS)
    source: str = "analytic"
    # a mixture-of-experts model (cockpit.models.moe): the routed experts' parameters, all layers, and
    # the part of them a token runs through (top_k / experts of them); 0 for a dense model
    experts: int = 0
    experts_active: int = 0
    # a vision-language model (LLaVA): its vision tower's and projector's parameters, in ``total`` (the
    # language model's counts above); a token of text runs through neither (cockpit.plan.flops)
    vision: int = 0
    projector: int = 0
    # their nn.Linear weights: bitsandbytes quantizes them as it does the language model's (LLaMA-Factory 0.9.5
    # skips no part of a vision-language model; transformers keeps only the LM head: plan.estimate)
    vision_linear: int = 0

    @property
    def active(self) -> int:
        """The parameters a token runs through: all but the routed experts it is not sent to (and a
        vision-language model's vision tower and projector, which its image tokens' features come from)."""
        return self.total - self.experts + self.experts_active - self.vision - self.projector

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def analytic_counts(d: Dims, model_config: Mapping[str, Any] | None = None) -> ParamCounts:
    """Llama layout; an MoE config's (cockpit.models.moe) MLP as its routed experts (SwiGLU, each
    ``moe_intermediate_size`` wide, else ``intermediate_size``), a router and shared experts."""
    from cockpit.models.moe import experts_of

    found = experts_of(model_config) if model_config is not None else None
    if found is not None:
        return _analytic_moe(d, model_config or {}, found)
    shapes = linear_shapes(d)
    lin = sum(i * o for i, o in shapes.values())
    bias = (d.q_dim + 2 * d.kv_dim) if d.qkv_bias else 0
    per_layer = lin + bias + layer_norms(d.model_type, d.hidden, d.head_dim)
    emb = d.vocab * d.hidden
    head = 0 if d.tied else emb
    other = d.hidden
    return ParamCounts(
        total=emb + head + d.layers * per_layer + other,
        embedding=emb,
        lm_head=head,
        per_layer=per_layer,
        layer_linear=lin,
        layers=d.layers,
        other=other,
        max_linear=max(i * o for i, o in shapes.values()),
        source="analytic",
    )


def _analytic_moe(d: Dims, model_config: Mapping[str, Any], found: Any) -> ParamCounts:
    width = int(model_config.get("moe_intermediate_size") or d.intermediate)
    expert = 3 * d.hidden * width
    shared = found.shared * expert
    attn = {k: v for k, v in linear_shapes(d).items() if k in ("q_proj", "k_proj", "v_proj", "o_proj")}
    lin = sum(i * o for i, o in attn.values()) + found.routed * expert + shared + d.hidden * found.routed
    bias = (d.q_dim + 2 * d.kv_dim) if d.qkv_bias else 0
    per_layer = lin + bias + 2 * d.hidden
    emb = d.vocab * d.hidden
    head = 0 if d.tied else emb
    routed = d.layers * found.routed * expert
    return ParamCounts(
        total=emb + head + d.layers * per_layer + d.hidden,
        embedding=emb,
        lm_head=head,
        per_layer=per_layer,
        layer_linear=lin,
        layers=d.layers,
        other=d.hidden,
        max_linear=max([i * o for i, o in attn.values()] + [d.hidden * width]),
        linear_names=tuple(attn),
        source="analytic",
        experts=routed,
        experts_active=round(routed * found.active_share),
    )


def _key(model_config: Mapping[str, Any]) -> str:
    return json.dumps(model_config, sort_keys=True, default=str)


def _meta_model(model_config: Mapping[str, Any], layers: int | None = None):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = {
        k: v
        for k, v in model_config.items()
        if not k.startswith("_") and k not in ("architectures", "transformers_version")
    }
    mt = kw.pop("model_type", "llama")
    if layers is not None:
        kw["num_hidden_layers"] = layers
    hf_cfg = AutoConfig.for_model(mt, **kw)
    with torch.device("meta"), _without_zero3_init():
        return AutoModelForCausalLM.from_config(hf_cfg)


def _without_zero3_init() -> Any:
    """A context in which transformers builds a model as it is, not under DeepSpeed's ``zero.Init``:
    inside a ZeRO-3 run (the training process's FLOPs meter counts the model on rank 0 alone) that
    would partition the meta model with a broadcast no other rank joins, and hang the run.
    transformers' own ``set_zero3_state`` says "zero.Init is handled"; a nullcontext where it is
    missing (no ZeRO-3 then either)."""
    import contextlib

    try:
        from transformers.modeling_utils import set_zero3_state
    except ImportError:
        return contextlib.nullcontext()
    return set_zero3_state()


@functools.lru_cache(maxsize=32)
def _meta_counts(key: str) -> ParamCounts:
    import torch.nn as nn

    model_config = json.loads(key)
    model = _meta_model(model_config)
    emb = head = other = 0
    layer_tot: dict[str, int] = {}
    layer_lin: dict[str, int] = {}
    names: set[str] = set()
    max_linear = 0
    for mname, mod in model.named_modules():
        if isinstance(mod, nn.Linear) and ".layers." in f".{mname}.":
            idx = mname.split("layers.")[1].split(".")[0]
            layer_lin[idx] = layer_lin.get(idx, 0) + mod.weight.numel()
            names.add(mname.rsplit(".", 1)[-1])
            max_linear = max(max_linear, mod.weight.numel())
    experts = 0
    for pname, p in model.named_parameters():  # remove_duplicate=True: tied weights once
        n = p.numel()
        experts += n if ".experts." in f".{pname}" else 0  # routed experts (shared_expert(s) are not)
        if "layers." in pname:
            idx = pname.split("layers.")[1].split(".")[0]
            layer_tot[idx] = layer_tot.get(idx, 0) + n
        elif "embed_tokens" in pname:
            emb += n
        elif "lm_head" in pname:
            head += n
        else:
            other += n
    nl = len(layer_tot)
    per_layer = max(layer_tot.values()) if layer_tot else 0
    return ParamCounts(
        total=emb + head + sum(layer_tot.values()) + other,
        embedding=emb,
        lm_head=head,
        per_layer=per_layer,
        layer_linear=max(layer_lin.values()) if layer_lin else 0,
        layers=nl,
        other=other,
        max_linear=max_linear,
        linear_names=tuple(n for n in LLAMA_LINEARS if n in names) + tuple(sorted(names - set(LLAMA_LINEARS))),
        source="meta",
        experts=experts,
        experts_active=_active_experts(model_config, experts),
    )


def _active_experts(model_config: Mapping[str, Any], experts: int) -> int:
    """The routed experts' parameters a token runs through: top_k / experts of them."""
    from cockpit.models.moe import experts_of

    found = experts_of(model_config)
    return round(experts * found.active_share) if found is not None and experts else experts


def count_params(model_config: Mapping[str, Any], *, allow_meta: bool = True) -> ParamCounts:
    """Parameter counts of the model ``model_config`` (a config.json dict; a LLaVA's: its language
    model's, with its vision tower and projector added: :func:`vision_counts`)."""
    counts = None
    if allow_meta:
        try:
            counts = _meta_counts(_key(model_config))
        except Exception:  # noqa: BLE001 - no torch/transformers, unknown arch: fall back
            pass
    counts = counts or analytic_counts(dims_of(model_config), model_config)
    vision, projector, linear = vision_counts(model_config, allow_meta=allow_meta)
    if not (vision or projector):
        return counts
    return replace(
        counts, total=counts.total + vision + projector, vision=vision, projector=projector, vision_linear=linear
    )


def vision_counts(model_config: Mapping[str, Any], *, allow_meta: bool = True) -> tuple[int, int, int]:
    """(vision tower, projector, their nn.Linear weights) parameters of a LLaVA (``_vision_config`` from
    plan.catalogue): the tower built on the meta device from its config (``allow_meta`` false, or no torch: a
    CLIP tower counted from its config's numbers, :func:`clip_tower_params`), LLaVA's two-layer projector from
    the two widths; (0, 0, 0) for a text model or a tower neither way counts."""
    if isinstance(model_config.get("_vlm_config"), dict):  # Qwen2-VL & co: the whole model on the meta device,
        whole = model_config["_vlm_config"]  # else (the UI's planner, no torch) counted from its config.json alone
        counted = _composite_counts(_key(whole)) if allow_meta else (0, 0, 0)
        return counted if any(counted) else composite_params(whole) or (0, 0, 0)
    vision_config = model_config.get("_vision_config")
    if not isinstance(vision_config, dict):
        return 0, 0, 0
    tower = None
    if allow_meta:
        try:
            tower = _meta_vision_params(_key(vision_config))
        except Exception:  # noqa: BLE001 - no torch / transformers, an unknown tower: counted below if CLIP
            tower = None
    tower = tower if tower is not None else clip_tower_params(vision_config)
    if tower is None:
        return 0, 0, 0
    layers = model_config.get("_vision_feature_layers", 1)
    width, text = int(vision_config.get("hidden_size", 0)) * int(layers), int(model_config.get("hidden_size", 0))
    # linear_1 and linear_2, each with its bias
    return tower[0], width * text + text + text * text + text, tower[1] + width * text + text * text


def clip_tower_params(vision_config: Mapping[str, Any]) -> tuple[int, int] | None:
    """A CLIP vision tower's (parameters, nn.Linear weights) from its config's numbers (transformers'
    ``CLIPVisionModel``: patch embedding without bias, class and position embeddings, pre- and post-layer norms,
    each layer's attention, MLP and two norms), torch-free (the UI's planner); None for another tower."""
    if vision_config.get("model_type", "clip_vision_model") != "clip_vision_model":
        return None
    h, i = int(vision_config.get("hidden_size", 768)), int(vision_config.get("intermediate_size", 3072))
    patch, size = int(vision_config.get("patch_size", 32)), int(vision_config.get("image_size", 224))
    channels, layers = int(vision_config.get("num_channels", 3)), int(vision_config.get("num_hidden_layers", 12))
    embeddings = h + channels * h * patch * patch + ((size // patch) ** 2 + 1) * h
    layer = 4 * (h * h + h) + (h * i + i) + (i * h + h) + 2 * 2 * h
    return embeddings + 2 * 2 * h + layers * layer, layers * (4 * h * h + 2 * h * i)


@functools.lru_cache(maxsize=8)
def _composite_counts(key: str) -> tuple[int, int, int]:
    """(vision tower, projector, their nn.Linear weights) parameters of a composite model built whole on the
    meta device, split by its parts' names as LLaMA-Factory registers them (cockpit.models.vlm.COMPOSITE);
    (0, 0, 0) if it cannot be built."""
    from cockpit.models.vlm import COMPOSITE

    try:
        import torch
        from transformers import AutoConfig, AutoModelForImageTextToText

        kw = {k: v for k, v in json.loads(key).items() if k not in ("architectures", "transformers_version")}
        parts = COMPOSITE[kw["model_type"]]
        config = AutoConfig.for_model(kw.pop("model_type"), **kw)
        with torch.device("meta"), _without_zero3_init():
            model = AutoModelForImageTextToText.from_config(config)
    except Exception:  # noqa: BLE001 - no torch / transformers, a config this transformers cannot build
        return 0, 0, 0
    named = list(model.named_parameters())
    vision = sum(p.numel() for n, p in named if any(k in n for k in parts.vision_model_keys))
    projector = sum(p.numel() for n, p in named if any(k in n for k in parts.projector_keys))
    keys = (*parts.vision_model_keys, *parts.projector_keys)
    return vision, projector, _linear_weights(model, lambda name: any(k in name for k in keys))


def _linear_weights(model: Any, chosen: Callable[[str], bool]) -> int:
    """The nn.Linear weights (no biases: bitsandbytes keeps them) of the modules whose names ``chosen`` picks."""
    import torch

    return sum(m.weight.numel() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and chosen(n))


@functools.lru_cache(maxsize=8)
def _meta_vision_params(key: str) -> tuple[int, int]:
    """A vision tower's (parameters, nn.Linear weights), built on the meta device from its config."""
    import torch
    from transformers import AutoConfig, AutoModel

    kw = {k: v for k, v in json.loads(key).items() if k not in ("architectures", "transformers_version")}
    config = AutoConfig.for_model(kw.pop("model_type"), **kw)
    with torch.device("meta"), _without_zero3_init():
        tower = AutoModel.from_config(config)
    return sum(p.numel() for p in tower.parameters()), _linear_weights(tower, lambda _: True)


def resolve_targets(lora_target: Any, available: tuple[str, ...]) -> list[str]:
    """LLaMA-Factory's ``lora_target``: "all" (every decoder linear) or a comma list."""
    if lora_target is None or (isinstance(lora_target, str) and lora_target.strip().lower() == "all"):
        return list(available)
    items = lora_target if isinstance(lora_target, (list, tuple)) else str(lora_target).split(",")
    names = [str(x).strip() for x in items if str(x).strip()]
    unknown = [n for n in names if n not in available]
    if unknown or not names:
        from cockpit.errors import InputError, Problem

        raise InputError(
            Problem(
                f"unknown module(s) {', '.join(unknown) or '(empty)'}; this model's linears are "
                f"{', '.join(available)} (or 'all')",
                key="lora_target",
            )
        )
    return names


def analytic_lora(d: Dims, targets: list[str], rank: int, experts: bool = False) -> int:
    """r * (in + out) per target; ``experts``: an MoE model's fused expert tensors too, as PEFT adapts
    them (per expert, gate_up (h -> 2 I) and down (I -> h))."""
    shapes = linear_shapes(d)
    fused = d.experts * rank * ((d.hidden + 2 * d.expert_intermediate) + (d.expert_intermediate + d.hidden))
    return d.layers * (sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets if t in shapes) + fused * experts)


@functools.lru_cache(maxsize=64)
def _peft_lora(key: str, targets: tuple[str, ...], rank: int, experts: bool = False) -> int:
    from peft import LoraConfig, get_peft_model

    from cockpit.models.moe import expert_parameters

    model_config = json.loads(key)
    layers = int(model_config["num_hidden_layers"])
    model = _meta_model(model_config, layers=1)
    # lora_target: all on an MoE model: the fused expert tensors too (cockpit.train.model.moe_lora_targets)
    fused = {"target_parameters": expert_parameters(model)} if experts and expert_parameters(model) else {}
    with warnings.catch_warnings():  # PEFT reads transformers' deprecated alias (a FutureWarning in every plan)
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        pm = get_peft_model(
            model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=list(targets), lora_dropout=0.0, **fused)
        )
    per_layer = sum(p.numel() for n, p in pm.named_parameters() if "lora_" in n)
    return per_layer * layers


def count_lora(
    model_config: Mapping[str, Any], targets: list[str], rank: int, *, allow_meta: bool = True, experts: bool = False
) -> tuple[int, str]:
    """Trainable LoRA parameters and where the number came from ("peft-meta" or "analytic").
    ``experts``: an MoE model's fused expert tensors adapted too (``lora_target: all``)."""
    if allow_meta:
        try:
            return _peft_lora(_key(model_config), tuple(targets), int(rank), experts), "peft-meta"
        except Exception:  # noqa: BLE001
            pass
    return analytic_lora(dims_of(model_config), targets, rank, experts), "analytic"
