"""LLaMA-Factory's LoRA variants, optimizer, evaluation and model-loading keys, as the keyword
arguments of the libraries that implement them (PEFT's LoraConfig, HF's TrainingArguments and
from_pretrained, PEFT's LoRA+ optimizer). Imported by the training rank (worker.py) and tune."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.errors import InputError

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

ATTENTION = {"auto": None, "sdpa": "sdpa", "eager": "eager", "disabled": "eager", "fa2": "flash_attention_2"}


def model_load_kwargs(cfg: RunConfig, ref: Any = None, log: Callable[[str], object] = print) -> dict[str, Any]:
    """from_pretrained: the attention kernel (``flash_attn``; auto leaves transformers' choice),
    RoPE scaling (``rope_scaling``) for a cutoff_len beyond the model's context, and an MoE model's
    router loss (``moe_aux_loss_coef``: ``router_aux_loss_coef`` and ``output_router_logits`` on the
    config, as LLaMA-Factory's ``configure_moe`` sets them; :mod:`cockpit.models.moe`)."""
    from cockpit.models.moe import aux_loss_overrides

    impl = ATTENTION[cfg.flash_attn or "auto"]
    out: dict[str, Any] = {"attn_implementation": impl} if impl else {}
    out.update(aux_loss_overrides(cfg.moe_aux_loss_coef))
    if cfg.rope_scaling and ref is not None:
        rope = rope_scaling_kwargs(cfg, ref, log)
        if rope:
            out["rope_parameters"] = rope  # transformers 5's name for a config's RoPE settings
    return out


def rope_scaling_kwargs(cfg: RunConfig, ref: Any, log: Callable[[str], object] = print) -> dict[str, Any] | None:
    """LLaMA-Factory's rope_scaling: factor ceil(cutoff_len / the model's max_position_embeddings);
    none (said in the log) when cutoff_len already fits."""
    import math

    from transformers import AutoConfig

    mcfg = AutoConfig.from_pretrained(ref.path, **ref.kwargs())
    context = int(getattr(mcfg, "max_position_embeddings", 0) or 0)
    want = int(cfg.cutoff_len)
    if not context or want <= context:
        log(f"rope_scaling {cfg.rope_scaling}: cutoff_len {want} fits the model's context ({context}); not scaled")
        return None
    factor = float(math.ceil(want / context))
    base = dict(getattr(mcfg, "rope_parameters", None) or {}) or {"rope_theta": getattr(mcfg, "rope_theta", 10000.0)}
    rope: dict[str, Any] = {**base, "rope_type": cfg.rope_scaling, "factor": factor}
    if cfg.rope_scaling in ("dynamic", "yarn", "llama3"):
        rope["original_max_position_embeddings"] = context
    if cfg.rope_scaling == "llama3":
        rope.update(low_freq_factor=1.0, high_freq_factor=4.0)
    log(f"rope_scaling {cfg.rope_scaling}: factor {factor:g} for cutoff_len {want} (context {context})")
    return rope


def upcast(model: Any, cfg: RunConfig) -> None:
    """upcast_layernorm: norm weights in fp32; upcast_lmhead_output: the LM head's logits (a value
    model's scores) in fp32."""
    import torch

    if cfg.upcast_layernorm:
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.data = p.data.to(torch.float32)
    if cfg.upcast_lmhead_output:
        head = model.get_output_embeddings() or getattr(model, "score", None)  # a value model's head: score
        if head is None:
            raise InputError("upcast_lmhead_output: the model has no LM head (output embeddings) nor score head")
        head.register_forward_hook(lambda _m, _inp, out: out.to(torch.float32))


def lora_config_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """LoraConfig: DoRA, rsLoRA, PiSSA init (as LLaMA-Factory maps it), modules trained fully."""
    out: dict[str, Any] = {"use_dora": bool(cfg.use_dora), "use_rslora": bool(cfg.use_rslora)}
    if cfg.pissa_init:
        it = int(cfg.pissa_iter)
        out["init_lora_weights"] = "pissa" if it == -1 else f"pissa_niter_{it}"
    if cfg.additional_target:
        out["modules_to_save"] = [m.strip() for m in str(cfg.additional_target).split(",") if m.strip()]
    return out


def gradient_checkpointing(cfg: RunConfig) -> tuple[bool, dict[str, bool] | None]:
    """Whether activations are recomputed in backward (``gradient_checkpointing`` unless
    ``disable_gradient_checkpointing``) and torch's checkpoint kwargs (``use_reentrant_gc``): the
    Trainer's and QLoRA's k-bit preparation read the same pair (``use_unsloth_gc``:
    :func:`offload_checkpoints` once the Trainer has turned checkpointing on)."""
    gc = bool(cfg.gradient_checkpointing) and not cfg.disable_gradient_checkpointing
    return gc, ({"use_reentrant": bool(cfg.use_reentrant_gc)} if gc else None)


def offload_checkpoints(model: Any) -> int:
    """``use_unsloth_gc``: every checkpointed module's checkpoint function runs under torch's
    ``save_on_cpu``. torch.utils.checkpoint saves a layer's inputs outside its own hooks, so those
    (the hidden states each layer starts from: layers x tokens x hidden) go to host memory, pinned where
    an accelerator is present, and come back for the backward; the recomputed insides are checkpoint's
    as before. transformers' own ``offload`` is the same but asks a CPU-only host for pinned memory
    (an error), so the CPU could not run the path the GPU runs. Returns the modules wrapped."""
    import torch
    from torch.autograd.graph import save_on_cpu

    pin = torch.cuda.is_available()  # ROCm's HIP devices too
    wrapped = 0
    for module in model.modules():
        checkpoint = getattr(module, "_gradient_checkpointing_func", None)
        if checkpoint is None or getattr(checkpoint, "offloads", False):
            continue

        def offloaded(function: Any, *args: Any, _checkpoint: Any = checkpoint, **kwargs: Any) -> Any:
            with save_on_cpu(pin_memory=pin):
                return _checkpoint(function, *args, **kwargs)

        offloaded.offloads = True  # type: ignore[attr-defined]
        module._gradient_checkpointing_func = offloaded
        wrapped += 1
    return wrapped


def training_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """TrainingArguments: optimizer and schedule options, gradient checkpointing, evaluation."""
    out: dict[str, Any] = {
        "adam_beta1": cfg.adam_beta1,
        "adam_beta2": cfg.adam_beta2,
        "adam_epsilon": cfg.adam_epsilon,
    }
    if cfg.optim:
        out["optim"] = cfg.optim
    from cockpit.config.parity import low_rank_optim

    out.update(low_rank_optim(cfg.mapping()) or {})  # use_galore / use_apollo: HF's galore_* / apollo_* optimizers
    if cfg.lr_scheduler_kwargs:
        out["lr_scheduler_kwargs"] = dict(cfg.lr_scheduler_kwargs)
    out["gradient_checkpointing"], out["gradient_checkpointing_kwargs"] = gradient_checkpointing(cfg)
    if cfg.val_size or cfg.eval_dataset:
        from cockpit.config.parity import eval_schedule

        strategy, steps = eval_schedule(cfg.mapping())
        out.update(
            eval_strategy=strategy,
            per_device_eval_batch_size=int(cfg.per_device_eval_batch_size or 1),
            eval_on_start=bool(cfg.eval_on_start),
            load_best_model_at_end=bool(cfg.load_best_model_at_end),
        )
        if steps:
            out["eval_steps"] = steps
        if cfg.metric_for_best_model:
            out["metric_for_best_model"] = cfg.metric_for_best_model
        if cfg.greater_is_better is not None:
            out["greater_is_better"] = bool(cfg.greater_is_better)
    return out


def eval_dataset_rows(cfg: RunConfig, tokenizer: Any) -> list[dict[str, Any]]:
    """The ``eval_dataset`` rendered like the training data (same template, cutoff, max_samples)."""
    from cockpit.data.prepare import prepare_dataset

    return prepare_dataset(cfg.replace(dataset=cfg.eval_dataset), tokenizer).rows()  # with its images


def accuracy_kwargs(cfg: RunConfig) -> dict[str, Any]:
    """Trainer: ``compute_accuracy``'s metric (``eval_accuracy``) and the argmax that keeps the
    evaluation from gathering whole logits (LLaMA-Factory's ComputeAccuracy / eval_logit_processor)."""
    if not cfg.compute_accuracy:
        return {}
    return {"compute_metrics": token_accuracy, "preprocess_logits_for_metrics": predicted_token_ids}


def predicted_token_ids(logits: Any, labels: Any) -> Any:
    """The argmax token at every position (what the evaluation gathers instead of the logits)."""
    if isinstance(logits, (list, tuple)):  # a model that returns more than the logits
        logits = logits[0] if logits[0].dim() == 3 else logits[1]
    return logits.argmax(dim=-1)


def token_accuracy(eval_preds: Any) -> dict[str, float]:
    """The share of labelled tokens whose prediction (the argmax at the position before) is the
    label, per sample (a row: with packing, the evaluation pads), averaged over the samples: -100 (prompt,
    padding) left out, rows without labels skipped."""
    import numpy as np

    predictions, labels = np.asarray(eval_preds.predictions), np.asarray(eval_preds.label_ids)
    per_sample = []
    for predicted, label in zip(predictions[:, :-1], labels[:, 1:], strict=True):
        kept = label != -100
        if kept.any():
            per_sample.append(float(np.mean(predicted[kept] == label[kept])))
    return {"accuracy": float(np.mean(per_sample)) if per_sample else 0.0}


def trainer_kwargs(cfg: RunConfig, model: Any, args: Any) -> dict[str, Any]:
    """Trainer: a LoRA+ optimizer (PEFT's create_loraplus_optimizer over the optimizer class and
    arguments HF would use: optim, betas, eps, weight decay), a BAdam optimizer, Muon, Adam-mini, else nothing."""
    if cfg.use_badam:
        return {"optimizers": (badam_optimizer(cfg, model, args), None)}
    if cfg.use_muon:
        from cockpit.train.muon import muon_optimizer

        return {"optimizers": (muon_optimizer(model, args), None)}
    if cfg.use_adam_mini:
        return {"optimizers": (adam_mini_optimizer(model, args), None)}
    if not cfg.loraplus_lr_ratio:
        return {}
    from peft.optimizers import create_loraplus_optimizer
    from transformers import Trainer

    optim_cls, optim_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    optim_kwargs = {k: v for k, v in optim_kwargs.items() if k != "lr"}
    optimizer = create_loraplus_optimizer(
        model,
        optim_cls,
        lr=args.learning_rate,
        loraplus_lr_ratio=float(cfg.loraplus_lr_ratio),
        loraplus_lr_embedding=float(cfg.loraplus_lr_embedding),
        weight_decay=args.weight_decay,
        **optim_kwargs,
    )
    return {"optimizers": (optimizer, None)}


def adam_mini_optimizer(model: Any, args: Any) -> Any:
    """Adam-mini as LLaMA-Factory builds it (trainer_utils._create_adam_mini_optimizer): the model's named
    parameters with its hidden size and query / key-value head counts, HF's lr, betas, eps, weight decay
    (its per-block log lines off: one per parameter)."""
    from adam_mini import Adam_mini

    config = model.config
    return Adam_mini(
        named_parameters=model.named_parameters(),
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        weight_decay=args.weight_decay,
        dim=getattr(config, "hidden_size", None),
        n_heads=getattr(config, "num_attention_heads", None),
        n_kv_heads=getattr(config, "num_key_value_heads", None),
        verbose=False,
    )


def badam_optimizer(cfg: RunConfig, model: Any, args: Any) -> Any:
    """BAdam as LLaMA-Factory builds it (trainer_utils._create_badam_optimizer): the trainable
    parameters in a decay and a no-decay group; layer mode wraps HF's optimizer (torch AdamW) over
    them in ``badam.BlockOptimizer``, which trains one decoder layer at a time (fp32 copies and Adam
    moments of that layer only, the others frozen) and moves to the next every
    ``badam_switch_interval`` steps; ratio mode is ``badam.BlockOptimizerRatio``, a sparse Adam over
    ``badam_update_ratio`` of every weight's entries (embeddings frozen)."""
    import warnings

    from transformers import Trainer

    decay = set(Trainer.get_decay_parameter_names(None, model))
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
        {"params": [p for n, p in named if n in decay], "weight_decay": args.weight_decay},
    ]
    optim_cls, optim_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, model)
    verbose = int(cfg.badam_verbose or 0)
    with warnings.catch_warnings():  # "expects bf16/fp16 weights" lists every fp32 parameter (the CPU, fp16 runs)
        warnings.filterwarnings("ignore", message="BAdam expect model")
        if cfg.badam_mode == "ratio":
            from badam import BlockOptimizerRatio

            return BlockOptimizerRatio(
                param_groups=groups,
                named_parameters_list=list(model.named_parameters()),
                update_ratio=float(cfg.badam_update_ratio),
                mask_mode=cfg.badam_mask_mode,
                verbose=verbose,
                include_embedding=False,
                # a tied LM head is the embedding (frozen with it); BAdam looks for an lm_head parameter
                include_lm_head=not any("lm_head" in n for n, _ in model.named_parameters()),
                **{k: v for k, v in optim_kwargs.items() if k in ("lr", "betas", "eps")},
            )
        from badam import BlockOptimizer

        interval = int(cfg.badam_switch_interval or 50)
        return BlockOptimizer(
            base_optimizer=optim_cls(groups, **optim_kwargs),
            named_parameters_list=list(model.named_parameters()),
            block_prefix_list=None,  # one block per decoder layer (model.layers.N.)
            switch_block_every=interval if interval > 0 else 2**62,  # -1: never switch
            start_block=cfg.badam_start_block,
            switch_mode=cfg.badam_switch_mode,
            verbose=verbose,
        )


def freeze_module_selected(param_name: str, modules: str | None) -> bool:
    """freeze_trainable_modules: whether a parameter of a trained layer (``mlp.up_proj.weight``)
    is trained: 'all', or one of its dotted name's parts is in the comma list."""
    if not modules or modules == "all":
        return True
    wanted = {m.strip() for m in modules.split(",") if m.strip()}
    return bool(wanted & set(param_name.split(".")))


def save_pissa_initial(model: Any, folder: Path, resuming: bool = False) -> bool:
    """``pissa_convert``: the PiSSA adapter as initialised, before any step (atomically). An
    attempt that resumes from a checkpoint keeps the one already there (the weights it trains
    on started from it); a run from scratch replaces any (a reused output_dir). Saved with
    ``init_lora_weights: true`` so that loading it never decomposes the base again (PEFT's
    condition for the conversion). False when the one there was kept."""
    import os
    import shutil

    if resuming and folder.is_dir():
        return False
    staging = folder.with_name(f".{folder.name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    config = model.peft_config["default"]
    init = config.init_lora_weights
    config.init_lora_weights = True
    try:
        model.save_pretrained(str(staging))
    finally:
        config.init_lora_weights = init
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(staging, folder)
    return True


def convert_pissa_adapter(model: Any, adapter_dir: Path, initial_dir: Path) -> None:
    """``pissa_convert``: rewrite the saved final adapter as a plain LoRA that applies to the
    ORIGINAL base: PEFT's ``save_pretrained(path_initial_model_for_weight_conversion=...)`` turns
    the trained A, B and the initial A0, B0 into [A | A0], [B | -B0] (rank 2r, alpha doubled:
    the same scaling), i.e. AB - A0B0 = the change training made to W. The adapter's files are
    replaced atomically, each; the model in memory stays the trained PiSSA model."""
    import os
    import shutil

    staging = adapter_dir.with_name(f".{adapter_dir.name}.pissa_converted")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(str(staging), path_initial_model_for_weight_conversion=str(initial_dir))
    for name in ("adapter_model.safetensors", "adapter_config.json"):
        os.replace(staging / name, adapter_dir / name)
    shutil.rmtree(staging, ignore_errors=True)
