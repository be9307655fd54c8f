"""The model a rank trains: base (+ quantization) + PEFT adapter / freeze / full, loaded whole,
on the meta device (FSDP2) or partitioned (ZeRO-3), and placed for its strategy."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from cockpit.config.schema import ADAPTER_METHODS
from cockpit.errors import InputError, Problem
from cockpit.store.rundir import RunDir

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from cockpit.config.run_config import RunConfig
    from cockpit.models.resolve import ModelRef
    from cockpit.models.vlm import Composite


def build_model(
    cfg: RunConfig,
    ref: ModelRef,
    use_cpu: bool,
    local_rank: int,
    load: str = "full",
    folder: str | None = None,
    value_head: bool = False,
) -> Any:
    """The model to train: base (+ quantization) + PEFT adapter / freeze / full.

    ``value_head``: the base with a one-output sequence-classification head (``score``) in place of
    its LM head: stage rm's value model, built the same way (quantization, vocabulary, upcasts,
    every LoRA key; its LoRA task keeps the head trained in full and saved with the adapter).

    ``load``: ``full`` (from_pretrained), ``meta`` (parameters on the meta device, for FSDP2's
    sharded load) or ``zero3`` (built partitioned under zero.Init, weights streamed from ``folder``,
    the safetensors folder :func:`cockpit.models.weights.weights_of` found): see
    :mod:`cockpit.train.sharded_load`."""
    from transformers import AutoModelForCausalLM, set_seed

    from cockpit.models.resolve import hub_ready
    from cockpit.train.variants import model_load_kwargs, upcast

    ref = hub_ready(ref)  # a hub id with the hub unreachable: from the HF cache only, no retries
    # before the base is built: the tokenizer loaded for it is freed (and its heap returned) while
    # this rank holds no weights yet, unless the embeddings must grow for it
    tokenizer = tokenizer_needing_rows(cfg, ref)
    set_seed(
        cfg.seed
    )  # the adapter's random init: the same on every rank (FSDP2 shards each rank's copy) and every run
    kwargs = base_load_kwargs(cfg, ref, use_cpu, local_rank)
    if load == "full":
        from transformers.integrations import is_deepspeed_zero3_enabled

        if is_deepspeed_zero3_enabled():  # from_pretrained builds under zero.Init: DeepSpeed must see every rank
            from cockpit.train.sharded_load import ensure_deepspeed_comm

            ensure_deepspeed_comm()
        if value_head:
            from transformers import AutoModelForSequenceClassification

            model = AutoModelForSequenceClassification.from_pretrained(
                ref.path, num_labels=1, **kwargs, **model_load_kwargs(cfg, ref)
            )
        elif is_vlm(cfg, ref):  # a vision-language model (issue 63): its image-text head
            from cockpit.train.vlm import load_base

            model = load_base(ref, {**kwargs, **model_load_kwargs(cfg, ref)})
        else:
            model = AutoModelForCausalLM.from_pretrained(ref.path, **kwargs, **model_load_kwargs(cfg, ref))
    elif value_head:
        raise ValueError("a value model loads whole (stage rm: DDP only)")
    else:
        from cockpit.train.sharded_load import sharded_base

        if folder is None:
            raise ValueError(f"a {load} load streams a safetensors folder; none was given")
        model = sharded_base(cfg, folder, kwargs["dtype"], load, model_load_kwargs(cfg, ref, log=lambda *_: None))
    from cockpit.train.private_memory import trace

    trace(f"build_model: base ({load})")
    if load == "zero3" or (load == "full" and is_zero3()):  # an MoE model's blocks gathered whole (cockpit.train.moe)
        from cockpit.train.moe import mark_zero3_leaves

        mark_zero3_leaves(model, print)
    model.config.use_cache = False
    attend_per_sample(model, cfg)
    new_token_ids = grown_vocabulary(model, cfg, tokenizer, load)  # add_tokens / add_special_tokens / resize_vocab
    del tokenizer
    upcast(model, cfg)  # upcast_layernorm / upcast_lmhead_output
    if cfg.quantization_bit:
        prepare_quantized_base(model, cfg)
    parts = vlm_parts(model, cfg)
    if cfg.finetuning_type == "lora":
        return lora_model(model, cfg, new_token_ids, task_type="SEQ_CLS" if value_head else "CAUSAL_LM")
    if cfg.finetuning_type == "oft":
        model = with_oft_adapter(model, cfg)
        if trainable_in_fp32(cfg):
            upcast_trainable(model)
        return model
    if parts is not None:  # full fine-tuning of a vision-language model: its frozen parts
        from cockpit.train.vlm import freeze_parts

        freeze_parts(model, cfg, parts)
    if cfg.finetuning_type == "freeze":
        freeze_all_but_chosen_layers(model, cfg)
        if new_token_ids:
            from cockpit.models.vocab import train_embedding_rows

            train_embedding_rows(model)
    return model


def is_zero3() -> bool:
    from transformers.integrations import is_deepspeed_zero3_enabled

    return bool(is_deepspeed_zero3_enabled())


def lora_model(
    model: Any,
    cfg: RunConfig,
    new_token_ids: list[int] | None = None,
    task_type: str = "CAUSAL_LM",
    peft_input_cast: bool = False,
    host_embedding: bool = True,
) -> Any:
    """The base with its LoRA adapter as training runs it: the input embedding in host memory
    (:mod:`cockpit.train.host_embedding`), the adapter (:func:`with_lora_adapter`), its
    trainable parameters in fp32 where training keeps them so, and no fp32 copy of each adapted input
    under autocast (:mod:`cockpit.train.adapter_input_cast`; ``peft_input_cast``: PEFT's copies kept,
    as PEFT and LLaMA-Factory run, for a benchmark; ``host_embedding=False``: the table on the device,
    to compare)."""
    from cockpit.train.adapter_input_cast import skip_cast_under_autocast
    from cockpit.train.host_embedding import keep_on_host

    if host_embedding:  # where nothing trains it (placed_model logs it)
        keep_on_host(model, cfg)
    model = with_lora_adapter(model, cfg, new_token_ids, task_type=task_type)
    if trainable_in_fp32(cfg):
        upcast_trainable(model)
    if not peft_input_cast:
        skip_cast_under_autocast(model)
    return model


def over_base(cfg: RunConfig, peft_input_cast: bool = False) -> Any:
    """``base -> the model training steps``, for a base built elsewhere (a random one, to measure its
    memory: ``cockpit.plan.measure``'s ``prepare``): per-sample SDPA for padding-free SFT rows and,
    for LoRA, :func:`lora_model`. ``cfg``: a full config (defaults filled in, lora_alpha set)."""

    def prepare(model: Any) -> Any:
        attend_per_sample(model, cfg)
        return lora_model(model, cfg, peft_input_cast=peft_input_cast) if cfg.finetuning_type == "lora" else model

    return prepare


def attend_per_sample(model: Any, cfg: RunConfig) -> None:
    """SDPA once per packed sample (cockpit.train.packed_attention) for padding-free SFT rows."""
    from cockpit.data.padding import padding_free
    from cockpit.train.packed_attention import use_for_padding_free

    if cfg.stage == "sft" and padding_free(cfg):
        use_for_padding_free(model)


def prepare_quantized_base(model: Any, cfg: RunConfig) -> None:
    """A 4-/8-bit base made ready for its adapter, as LLaMA-Factory does it (its own
    ``prepare_model_for_training``, not PEFT's ``prepare_model_for_kbit_training``): every base
    parameter frozen, and gradient checkpointing as the Trainer will have it (``gradient_checkpointing``
    unless ``disable_gradient_checkpointing``, ``use_reentrant_gc``; reentrant checkpoints need an input
    that asks for gradients). The parameters bitsandbytes does not quantize (embeddings, lm_head,
    norms) keep the run's dtype: PEFT's function casts them to fp32, which for Llama-3.1-8B is 1.05B
    parameters at 4 bytes instead of 2 (+1.96 GiB) and an fp32 residual stream. ``upcast_layernorm``
    / ``upcast_lmhead_output`` (``variants.upcast``) still ask for fp32 where wanted."""
    from cockpit.train.variants import gradient_checkpointing

    for param in model.parameters():
        param.requires_grad_(False)
    gc, gc_kwargs = gradient_checkpointing(cfg)
    if gc:
        if (gc_kwargs or {}).get("use_reentrant", True):
            model.enable_input_require_grads()
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gc_kwargs)


def tokenizer_needing_rows(cfg: RunConfig, ref: ModelRef) -> Any | None:
    """The run's tokenizer (:func:`tokenizer_as_trained`) when the embeddings must grow for it: the
    config adds tokens or sets ``resize_vocab``, or the chat template adds tokens past the model's
    ``vocab_size``; else None, this tokenizer freed and its heap handed back (43 MiB measured, in
    small blocks that would otherwise stay the rank's private memory)."""
    from cockpit.models import vocab
    from cockpit.models.resolve import load_model_config
    from cockpit.train.private_memory import return_freed_memory

    grows = vocab.grows_vocab(cfg)
    if not grows and not cfg.template:
        return None
    tokenizer = tokenizer_as_trained(cfg, ref)  # the same tokens, in the same order, as the rank's
    vocab_size = load_model_config(cfg, ref).get_text_config().vocab_size  # a VLM: its language model's
    if grows or len(tokenizer) > int(vocab_size):
        return tokenizer
    del tokenizer
    return_freed_memory()
    return None


def grown_vocabulary(model: Any, cfg: RunConfig, tokenizer: Any | None, load: str) -> list[int]:
    """The embeddings grown to the run's tokenizer (a multiple of 64) when the config adds tokens or
    sets ``resize_vocab`` (the token ids whose rows must train are returned), or when the chat
    template adds its stop words as new special tokens (llama3's on another model's tokenizer, say:
    their ids would be past the embeddings) which, as in LLaMA-Factory, get rows and no training.
    ``tokenizer``: :func:`tokenizer_needing_rows`' (None: nothing grows)."""
    from cockpit.models import vocab

    if tokenizer is None:
        return []
    grows = vocab.grows_vocab(cfg)
    weight = model.get_input_embeddings().weight
    rows = int(getattr(weight, "ds_shape", weight.shape)[0])  # ZeRO-3 keeps the whole shape aside
    if not grows and len(tokenizer) <= rows:
        return []
    if load != "full":
        key = ("add_special_tokens" if cfg.add_special_tokens else "add_tokens") if grows else "template"
        raise InputError(
            Problem(
                "new tokens (resized embeddings) with ZeRO-3 / FSDP2 sharded loading are not supported yet"
                + (
                    "" if grows else f": template {cfg.template} adds {len(tokenizer) - rows} to this model's tokenizer"
                ),
                key=key,
            )
        )
    rows_before = vocab.resize_to_tokenizer(model, tokenizer)
    return vocab.trained_token_ids(tokenizer, cfg, rows_before) if grows else []


def tokenizer_as_trained(cfg: RunConfig, ref: ModelRef) -> Any:
    """The run's tokenizer with its configured tokens and its chat template's (the rank's own)."""
    from cockpit.data.render import apply_template_choice
    from cockpit.models.resolve import load_tokenizer

    tokenizer = load_tokenizer(cfg, ref, log=lambda *_: None)
    if cfg.template:
        apply_template_choice(tokenizer, cfg.template, cfg.default_system, cfg.enable_thinking)
    return tokenizer


def base_load_kwargs(cfg: RunConfig, ref: ModelRef, use_cpu: bool, local_rank: int) -> dict[str, Any]:
    """``from_pretrained``'s arguments for the base: its dtype (LoRA: frozen base weights in the
    half precision, on a GPU and on the CPU alike, so autocast never recasts them; BAdam's layer mode
    in bf16 on a GPU; other full fine-tuning: fp32 master weights) and the 4-/8-bit quantization of
    QLoRA (bitsandbytes; its wheels carry CPU kernels too), placed at load on the training device."""
    import torch

    kwargs: dict[str, Any] = {"trust_remote_code": bool(cfg.trust_remote_code), **ref.model_kwargs()}
    if cfg.quantization_bit:
        from transformers import BitsAndBytesConfig

        compute = torch.bfloat16 if (cfg.bf16 or cfg.pure_bf16) else (torch.float16 if cfg.fp16 else torch.float32)
        kwargs["quantization_config"] = (
            BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type=cfg.quantization_type or "nf4",
                bnb_4bit_use_double_quant=bool(cfg.double_quantization),
                bnb_4bit_compute_dtype=compute,
            )
            if cfg.quantization_bit == 4
            else BitsAndBytesConfig(load_in_8bit=True)
        )
        kwargs["device_map"] = {"": "cpu" if use_cpu else local_rank}
    half = cfg.finetuning_type in ADAPTER_METHODS and (cfg.bf16 or (cfg.fp16 and not use_cpu))
    # BAdam's layer mode keeps fp32 copies of the active layer itself (LLaMA-Factory loads it in bf16);
    # fp16 keeps fp32 weights: the loss scaler cannot unscale fp16 gradients
    half = half or (bool(cfg.use_badam) and cfg.badam_mode == "layer" and cfg.bf16 and not use_cpu)
    kwargs["dtype"] = (torch.bfloat16 if cfg.bf16 else torch.float16) if half else torch.float32
    if cfg.pure_bf16:  # every weight in bf16, trained so (no fp32 master copy, no autocast)
        kwargs["dtype"] = torch.bfloat16
    return kwargs


def trainable_in_fp32(cfg: RunConfig) -> bool:
    """Whether a LoRA run's trainable parameters are cast to fp32 over a half-precision base, as
    LLaMA-Factory does (``cast_trainable_params_to_fp32``): every LoRA run in bf16 / fp16 but BAdam's.
    PEFT upcasts the adapter's own matrices, not ``modules_to_save`` copies or the new tokens' rows,
    which fp16 would then keep in fp16: HF's GradScaler refuses them ("Attempting to unscale FP16
    gradients") on a GPU."""
    if cfg.pure_bf16:  # LLaMA-Factory: "Pure bf16 detected, remaining trainable params in half precision"
        return False
    return cfg.finetuning_type in ADAPTER_METHODS and bool(cfg.bf16 or cfg.fp16) and not cfg.use_badam


def upcast_trainable(model: Any) -> int:
    """Every trainable parameter in fp32 (the frozen base keeps its dtype); how many were cast."""
    import torch

    cast = 0
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.to(torch.float32)
            cast += 1
    return cast


def with_lora_adapter(
    model: Any, cfg: RunConfig, new_token_ids: list[int] | None = None, task_type: str = "CAUSAL_LM"
) -> Any:
    """The base with its LoRA adapter: ``adapter_name_or_path`` trained further, or merged into the
    base with a new adapter on top (``create_new_adapter``), or a new one seeded by ``seed``; the
    rows of ``new_token_ids`` (added tokens) train beside it. ``task_type`` ``SEQ_CLS`` (a value
    model): PEFT trains the ``score`` head in full and saves it with the adapter; an adapter trained
    further must be such a one (a causal LM's has no head: ``create_new_adapter`` merges it instead)."""
    from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model
    from transformers import set_seed

    from cockpit.models.vocab import lora_new_rows_trainable
    from cockpit.train.variants import lora_config_kwargs

    adapter = cfg.adapter_name_or_path
    if adapter and not cfg.create_new_adapter:
        found = str(PeftConfig.from_pretrained(adapter).task_type or "")
        if task_type == "SEQ_CLS" and found != "SEQ_CLS":
            raise InputError(
                Problem(
                    f"stage rm trains a value model, and {adapter} is a {found or 'plain'} adapter without its value "
                    "head; set create_new_adapter: true to merge it into the base and train a new adapter with the head",
                    key="adapter_name_or_path",
                )
            )
        return PeftModel.from_pretrained(model, adapter, is_trainable=True, autocast_adapter_dtype=not cfg.pure_bf16)
    if adapter:  # create_new_adapter: the old adapter merged into the base, a new one trained
        old = PeftConfig.from_pretrained(adapter)
        if task_type != old.task_type:  # a causal LM's adapter over a value model: its LoRA matrices alone
            old.task_type = None
        model = PeftModel.from_pretrained(model, adapter, config=old).merge_and_unload()
    set_seed(cfg.seed)  # the adapter's init depends on the seed only, however the base was loaded
    targets = _target_modules(cfg.lora_target)
    expert_tensors: dict[str, Any] = {}
    if cfg.use_llama_pro:
        targets = expanded_block_modules(model, targets, cfg.freeze_trainable_layers)
    elif (parts := vlm_parts(model, cfg)) is not None:  # a vision-language model: the parts that train (issue 63)
        from cockpit.train.vlm import lora_target_names

        targets = lora_target_names(model, cfg, parts)
    elif targets == "all-linear":
        targets, expert_tensors = moe_lora_targets(model, targets)
    lora = LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=targets,
        task_type=task_type,
        **expert_tensors,
        # DoRA, rsLoRA, PiSSA, modules_to_save; the new tokens' rows
        **lora_new_rows_trainable(model, lora_config_kwargs(cfg), new_token_ids or []),
    )
    try:
        # pure_bf16: the adapter stays in the base's bf16 (PEFT casts a half-precision adapter to fp32 by default)
        return get_peft_model(model, lora, autocast_adapter_dtype=not cfg.pure_bf16)
    except ValueError as exc:
        raise InputError(f"lora_target: {exc}") from None


def moe_lora_targets(model: Any, targets: Any) -> tuple[Any, dict[str, Any]]:
    """``lora_target: all`` on an MoE model: every linear layer but the head and the routers, and the
    experts' fused weight tensors as PEFT's ``target_parameters`` (:func:`cockpit.train.moe.lora_targets`;
    PEFT's own ``all-linear`` would adapt the router too). A dense model keeps ``targets``."""
    from cockpit.train.moe import lora_targets

    found = lora_targets(model)
    if found is None:
        return targets, {}
    modules, parameters = found
    return modules, ({"target_parameters": parameters} if parameters else {})


def log_trainable(model: Any, log: Callable[[str], object]) -> None:
    """One line: the trainable parameters, their share, and (an adapter) the modules and parameters adapted."""
    from cockpit.train.flops_meter import _numel

    total = trainable = 0
    for p in model.parameters():
        total += _numel(p)
        trainable += _numel(p) if p.requires_grad else 0
    peft = getattr(model, "peft_config", {}).get("default")
    where = ""
    if peft is not None:
        modules = getattr(peft, "target_modules", None)
        parts = sorted(modules) if isinstance(modules, (set, list, tuple)) else [str(modules)]
        parts += sorted(getattr(peft, "target_parameters", None) or [])
        where = f": adapting {', '.join(parts)}"
    log(f"trainable parameters {trainable:,} of {total:,} ({100 * trainable / max(total, 1):.2f}%){where}")


def _target_modules(target: str) -> Any:
    """PEFT's target_modules of a lora_target / oft_target value: ``all`` = every linear layer but the head."""
    return "all-linear" if target == "all" else [t.strip() for t in target.split(",") if t.strip()]


def with_oft_adapter(model: Any, cfg: RunConfig) -> Any:
    """The base with a new OFT adapter (PEFT's OFTConfig, LLaMA-Factory's keys: ``oft_rank`` blocks or
    ``oft_block_size``, ``module_dropout``, ``additional_target`` trained fully), on ``oft_target``'s
    modules, else ``lora_target``'s (which LLaMA-Factory 0.9.5 reads for OFT); seeded by ``seed``."""
    from peft import OFTConfig, get_peft_model
    from transformers import set_seed

    from cockpit.train.variants import lora_config_kwargs

    set_seed(cfg.seed)
    extra = {k: v for k, v in lora_config_kwargs(cfg).items() if k == "modules_to_save"}
    oft = OFTConfig(
        r=cfg.oft_rank,
        oft_block_size=cfg.oft_block_size,
        module_dropout=cfg.module_dropout,
        target_modules=_target_modules(cfg.oft_target or cfg.lora_target),
        task_type="CAUSAL_LM",
        inference_mode=False,
        **extra,
    )
    try:
        return get_peft_model(model, oft, autocast_adapter_dtype=not cfg.pure_bf16)
    except ValueError as exc:  # a block size that does not divide a target's inputs, an unknown module
        raise InputError(f"{'oft_target' if cfg.oft_target else 'lora_target'} (finetuning_type oft): {exc}") from None


def freeze_all_but_chosen_layers(model: Any, cfg: RunConfig) -> None:
    """``finetuning_type: freeze``: only the last (or, negative, first) ``freeze_trainable_layers``
    decoder layers train, and in them only ``freeze_trainable_modules``."""
    from cockpit.train.variants import freeze_module_selected

    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        raise InputError("finetuning_type freeze: cannot find the decoder layers of this model")
    n = cfg.freeze_trainable_layers
    if cfg.use_llama_pro:
        chosen = expanded_layer_ids(len(layers), n)
    else:
        chosen = range(len(layers) - n, len(layers)) if n > 0 else range(0, -n)
    for p in model.parameters():
        p.requires_grad_(False)
    for i in chosen:
        for name, p in layers[i].named_parameters():
            p.requires_grad_(freeze_module_selected(name, cfg.freeze_trainable_modules))
    if not any(p.requires_grad for p in model.parameters()):
        raise InputError(
            f"freeze_trainable_modules: no module named {cfg.freeze_trainable_modules!r} in the trained layers"
        )
    if cfg.freeze_extra_modules:
        train_extra_modules(model, cfg.freeze_extra_modules)


def train_extra_modules(model: Any, names: str) -> None:
    """``freeze_extra_modules``: modules outside the decoder layers (``embed_tokens``, ``norm``,
    ``lm_head``) trained fully. A name is a parameter's module (the part before ``weight`` /
    ``bias``) with no layer index in its path, as LLaMA-Factory lists them; unlike its substring
    match, ``norm`` is the final norm only, never the layers' ``input_layernorm``."""
    import re

    outside_layers: dict[str, list[Any]] = {}
    for name, p in model.named_parameters():
        if re.search(r"\.\d+\.", name) is None and "." in name:
            outside_layers.setdefault(name.split(".")[-2], []).append(p)
    for module in (m.strip() for m in names.split(",") if m.strip()):
        if module not in outside_layers:
            raise InputError(
                Problem(
                    f"no module {module!r} outside the decoder layers; choose from {', '.join(sorted(outside_layers))}",
                    key="freeze_extra_modules",
                )
            )
        for p in outside_layers[module]:
            p.requires_grad_(True)


def expanded_layer_ids(num_layers: int, n_expanded: int) -> range:
    """LLaMA Pro's expanded blocks: ``n_expanded`` blocks added evenly, each the last of its group of
    ``num_layers / n_expanded`` (LLaMA-Factory's rule, so its expanded checkpoints train the same layers)."""
    if n_expanded <= 0 or num_layers % n_expanded:
        raise InputError(
            Problem(
                f"use_llama_pro: the model's {num_layers} layers must divide into {n_expanded} groups "
                "(freeze_trainable_layers = the number of expanded blocks)",
                key="freeze_trainable_layers",
            )
        )
    stride = num_layers // n_expanded
    return range(stride - 1, num_layers, stride)


def expanded_block_modules(model: Any, targets: Any, n_expanded: int) -> list[str]:
    """The LoRA targets (``all-linear`` or names) inside LLaMA Pro's expanded blocks, as full module names."""
    import torch

    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        raise InputError(Problem("cannot find the decoder layers of this model", key="use_llama_pro"))
    out = []
    for i in expanded_layer_ids(len(layers), n_expanded):
        for name, module in layers[i].named_modules():
            leaf = name.rsplit(".", 1)[-1]
            if (targets == "all-linear" and isinstance(module, torch.nn.Linear)) or (name and leaf in targets):
                out.append(f"layers.{i}.{name}")
    return out


def is_vlm(cfg: RunConfig, ref: ModelRef) -> bool:
    """Whether the model is a vision-language model Cockpit trains (its config read from its folder)."""
    from cockpit.models.resolve import load_model_config
    from cockpit.models.vlm import composite_of

    return composite_of(load_model_config(cfg, ref)) is not None


def vlm_parts(model: Any, cfg: RunConfig) -> Composite | None:
    """The vision-language model's parts (None for a text model), its keys' rule asked again first."""
    from cockpit.models.vlm import refuse_unhonoured
    from cockpit.train.vlm import parts_of

    parts = parts_of(model)
    if parts is not None:
        refuse_unhonoured(cfg, model.config)
    return parts


def config_only(ref: ModelRef) -> SimpleNamespace:
    """Something with the model's ``config.hidden_size`` (DeepSpeed's buckets) before the model exists."""
    from cockpit.strategy.deepspeed import hidden_size_of

    return SimpleNamespace(config=SimpleNamespace(hidden_size=hidden_size_of(ref.path)))


# how the base was loaded, in words: "full" read as full fine-tuning on a LoRA run
LOAD_WORDS = {
    "full": "whole, not sharded",
    "zero3": "zero3: partitioned as it loads",
    "fsdp_meta": "fsdp_meta: on the meta device, filled shard by shard",
}


def placed_model(
    run: RunDir,
    cfg: RunConfig,
    ref: ModelRef,
    args: TrainingArguments,
    rank: int,
    local_rank: int,
    use_cpu: bool,
    sharded: bool,
    log: Callable[[str], object],
) -> tuple[Any, type[Any]]:
    """The model on its training device (sharded for FSDP2), and the Trainer class to use.
    ZeRO-3 / FSDP2 never hold a full copy on every rank (:mod:`cockpit.train.sharded_load`)."""
    from cockpit.models.weights import strategy_shards_load
    from cockpit.train import sharded_load
    from cockpit.train.private_memory import trace
    from cockpit.train.trainer import CockpitTrainer

    trace("placed_model: start")
    world_size = int(args.world_size)
    mode, weights = sharded_load.load_mode(cfg, ref, sharded, world_size)
    if world_size > 1:
        _ = args.device  # sets up the process group (gloo / nccl) that zero.Init, fully_shard and the broadcast use
    why_whole = weights.why_whole
    try:
        model, extras, extras_from_rank0 = base_for_mode(cfg, ref, mode, weights.folder, rank, local_rank, use_cpu)
    except sharded_load.StreamRefused as exc:  # a tensor transformers converts as it loads: whole on every rank
        mode, why_whole = "full", str(exc)
        model, extras, extras_from_rank0 = build_model(cfg, ref, use_cpu, local_rank), None, False
    trace("placed_model: built")
    wanted_shards = strategy_shards_load(**sharded_load.strategy_facts(cfg, sharded, world_size))
    whole_why = f": {why_whole}" if (mode == "full" and wanted_shards and why_whole) else ""
    log(f"model loaded ({LOAD_WORDS.get(mode, mode)}{whole_why})")
    log_embedding_place(model, log)
    log_trainable(model, log)
    if not cfg.fsdp:
        return model, CockpitTrainer
    from cockpit.strategy.fsdp import shard, shard_report, trainer_class, write_report

    dtype = next(model.parameters()).dtype
    ties = sharded_load.tied_names(model)  # fully_shard unties them
    # the checkpoint's names -> the model's, asked before fully_shard renames the model's class
    names_of = sharded_load.checkpoint_renamer(model)
    names = names_of(weights.folder) if extras is not None and weights.folder else {}
    trace("placed_model: before shard")
    info = shard(
        model,
        cfg.fsdp,
        use_cpu=use_cpu,
        local_rank=local_rank,
        nnodes=int(cfg.nnodes),
        bf16=cfg.bf16,
        fp16=cfg.fp16,
    )
    if extras is not None and weights.folder is not None:
        device = args.device
        info["sharded_load"] = sharded_load.fsdp2_materialise_and_load(
            model,
            weights.folder,
            extras,
            rank=rank,
            device=device,
            dtype=dtype,
            names=names,
            ties=ties,
            extras_from_rank0=extras_from_rank0,
            log=log,
        )
    trace("placed_model: fsdp filled")
    report = shard_report(model)
    write_report(run.path, rank, info, report)
    log(
        f"FSDP2: {info['wrapped_modules']} x {info['layer_classes']} + root sharded over mesh {info['mesh']}; local {report['local_numel']} of {report['global_numel']} parameters"
    )
    return model, sharded_load.fsdp2_full_resume(
        trainer_class(CockpitTrainer), names_of
    )  # saves gather the sharded state dict first


def base_for_mode(
    cfg: RunConfig, ref: ModelRef, mode: str, folder: str | None, rank: int, local_rank: int, use_cpu: bool
) -> tuple[Any, dict[str, Any] | None, bool]:
    """The model built as ``mode`` says (:func:`cockpit.train.sharded_load.load_mode`), with FSDP2's adapter
    tensors for its sharded fill (None otherwise) and whether rank 0 broadcasts them. Raises
    :class:`cockpit.train.sharded_load.StreamRefused` when the checkpoint cannot be read part by part."""
    import gc

    from cockpit.models.weights import adapter_init_reads_base
    from cockpit.train import sharded_load

    if mode != "fsdp_meta":
        return build_model(cfg, ref, use_cpu, local_rank, load=mode, folder=folder), None, False
    assert folder is not None  # sharded_load_mode streams only a safetensors folder
    if adapter_init_reads_base(cfg):  # the adapter's init reads the base: rank 0 builds the model the one-rank way
        extras: dict[str, Any] = {}
        if rank == 0:
            real = build_model(cfg, ref, use_cpu, local_rank)
            extras = sharded_load.not_in_checkpoint(real, folder)
            del real
            gc.collect()
        return build_model(cfg, ref, use_cpu, local_rank, load="meta", folder=folder), extras, True
    # every rank's adapter is the seeded one a one-rank run makes, its base weights never built
    with sharded_load.adapters_kept_real():
        model = build_model(cfg, ref, use_cpu, local_rank, load="meta", folder=folder)
    return model, sharded_load.not_in_checkpoint(model, folder), False


def log_embedding_place(model: Any, log: Callable[[str], object]) -> None:
    """One line when the input embedding is in host memory (cockpit.train.host_embedding)."""
    from cockpit.train.host_embedding import HostEmbedding

    table = model.get_input_embeddings()
    if isinstance(table, HostEmbedding):
        weight = table.host_weight
        size = weight.numel() * weight.element_size()
        log(
            f"input embedding in host memory ({size / 2**30:.2f} GiB off the device): "
            "each forward copies only the rows it reads"
        )
