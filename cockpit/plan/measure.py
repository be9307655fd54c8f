"""Measure the real peak of live tensor bytes on CPU, for validating the planner.

How: a ``TorchDispatchMode`` sees every ATen op below autograd, including the backward ops the
autograd engine runs and the optimizer's ops. For every tensor an op returns we look at its
*storage* (views share one, so nothing is counted twice), add ``nbytes`` once, and hang a weakref
on the storage object whose callback subtracts it when the storage dies. PyTorch keeps one Python
object per live storage (PyObject preservation), so the callback fires when the memory is
really released, not when a Python wrapper goes away. Storages that existed before the mode was
entered (the model's weights) are registered with ``track_existing``.

With ``cap`` (bytes) the mode also stands in for a device allocator: when the tracked live bytes
go over the cap it raises ``torch.OutOfMemoryError`` from inside the op, so a CPU trial fails the
way a GPU one does and the same ``except torch.OutOfMemoryError`` handles both (``cockpit tune``).

What it cannot see: scratch memory a kernel allocates internally without returning it (e.g. the
blocked buffers inside the CPU flash-attention kernel), allocator rounding and fragmentation. On
CPU those are small; on GPUs the planner's runtime-overhead term stands for them.

Imports torch lazily (the module itself is importable without it).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from cockpit.config.run_config import RunConfig
from cockpit.data.padding import PADDING_KEYS, padding_free


def _mode_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveTensorBytes(TorchDispatchMode):
        """Tracks live storage bytes; ``peak`` is the high-water mark since the last ``reset_peak``.
        ``cap``: raise ``torch.OutOfMemoryError`` when live bytes exceed it (None: never)."""

        def __init__(self, cap: int | None = None) -> None:
            super().__init__()
            self.live = 0
            self.peak = 0
            self.cap = cap
            self._sizes: dict[int, int] = {}
            self._refs: dict[int, Any] = {}

        def _free(self, key: int, _ref: Any) -> None:
            self.live -= self._sizes.pop(key, 0)
            self._refs.pop(key, None)

        def track(self, t: Any) -> None:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                return
            st = t.untyped_storage()
            key = st._cdata
            n = st.nbytes()
            old = self._sizes.get(key)
            if old is None:
                self._refs[key] = weakref.ref(st, functools.partial(self._free, key))
                self._sizes[key] = n
                self.live += n
            elif old != n:  # resized in place
                self._sizes[key] = n
                self.live += n - old
            if self.live > self.peak:
                self.peak = self.live
                if self.cap is not None and self.live > self.cap:
                    # the CPU stand-in for the device allocator refusing an allocation
                    raise torch.OutOfMemoryError(
                        f"live tensor bytes {self.live} over the memory cap {self.cap} "
                        "(CPU stand-in for the device allocator)"
                    )

        def track_existing(self, tensors: Any) -> None:
            for t in tensors:
                self.track(t)

        def reset_peak(self) -> None:
            self.peak = self.live

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            leaves, _ = tree_flatten(out)
            for t in leaves:
                self.track(t)
            # in-place / out= ops may resize an argument's storage
            if func._schema.is_mutable:
                for t in tree_flatten((args, kwargs))[0]:
                    if isinstance(t, torch.Tensor):
                        self.track(t)
            return out

    return LiveTensorBytes


def live_tensor_bytes(cap: int | None = None):
    """A new ``LiveTensorBytes`` dispatch mode (use as a context manager); ``cap``: see the module doc."""
    return _mode_class()(cap)


def measure_training_peak(
    model_dir_or_cfg: Any,
    config: Mapping[str, Any],
    *,
    steps: int = 2,
    seed: int = 0,
    warmup_len: int | None = 16,
    prepare: Callable[[Any], Any] | None = None,
    trainer_class: Any = None,
) -> dict[str, Any]:
    """Peak live tensor bytes over ``steps`` optimizer steps of the real HF Trainer on CPU (fp32;
    with ``bf16: true`` in ``config``, the training rank's mixed precision: bf16 weights, fp32
    adapters, torch.autocast).

    ``model_dir_or_cfg``: a folder with config.json (+ weights, loaded if present) or a config dict
    (random init). ``config``: the run keys the planner reads (finetuning_type, lora_rank,
    lora_target, cutoff_len, per_device_train_batch_size, gradient_accumulation_steps,
    gradient_checkpointing, flash_attn). Every sequence is cutoff_len tokens long (the planner's
    worst case); with micro-batch > 1 the first row carries one padding token so the batch has an
    attention mask, as padded SFT batches do.

    ``warmup_len``: the first optimizer step runs on sequences this short (its job is only to
    create the AdamW states, which the later full-length steps then carry); the batches are
    fed in order. None: every step at cutoff_len.

    ``prepare``: builds the trained model from the base instead of the plain LoRA wrap (a bench
    passes the training rank's own adapter and attention setup; this layer cannot import it).
    ``trainer_class``: the Trainer subclass to run (a bench passes the rank's ``CockpitTrainer``,
    whose chunked loss the planner counts); HF's ``Trainer`` when None.
    """
    import contextlib
    import gc
    import io
    import tempfile

    import torch

    torch.manual_seed(seed)
    model = _fp32_model(model_dir_or_cfg, str(config.get("flash_attn", "auto")))
    if config.get("bf16"):  # the frozen base in bf16; PEFT keeps the adapters fp32 (autocast_adapter_dtype)
        model = model.to(torch.bfloat16)
    if prepare is not None:
        model = prepare(model)
    elif config.get("finetuning_type", "lora") == "lora":
        model = _with_lora(model, config)
    # SFT's packing (auto or asked): one padding-free row per micro-batch, as the training rank's
    packed = str(config.get("stage") or "sft") == "sft" and padding_free(
        RunConfig.from_mapping({k: config[k] for k in PADDING_KEYS if k in config})
    )
    rows = _synthetic_rows(
        model.config.vocab_size, config, steps=steps, seed=seed, warmup_len=warmup_len, padded=not packed
    )
    with tempfile.TemporaryDirectory() as out:
        trainer = _in_order_trainer(
            model, rows, config, steps=steps, seed=seed, output_dir=out, packed=packed, base=trainer_class
        )
        gc.collect()
        mode = live_tensor_bytes()
        with mode:
            mode.track_existing(list(model.parameters()) + list(model.buffers()))
            for row in rows:
                mode.track_existing(row.values())
            input_bytes = sum(t.untyped_storage().nbytes() for row in rows for t in row.values())
            weights = mode.live - input_bytes
            mode.reset_peak()
            with contextlib.redirect_stdout(io.StringIO()):  # the Trainer prints its metrics dict
                trainer.train()
        peak = mode.peak - input_bytes
    result = {
        "peak_bytes": peak,
        "weights_bytes": weights,
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
    }
    del trainer, model, rows
    gc.collect()
    return result


def _fp32_model(model_dir_or_cfg: Any, flash_attn: str) -> Any:
    """The model in fp32 without a KV cache: from a folder (weights if it has them, else random
    init from its config.json) or from a config dict (random init)."""
    import os

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    attn = {"auto": "sdpa", "sdpa": "sdpa", "disabled": "eager", "eager": "eager"}[flash_attn]
    if isinstance(model_dir_or_cfg, str) and os.path.isfile(os.path.join(model_dir_or_cfg, "config.json")):
        has_weights = any(f.endswith(".safetensors") for f in os.listdir(model_dir_or_cfg))
        if has_weights:
            model = AutoModelForCausalLM.from_pretrained(
                model_dir_or_cfg, dtype=torch.float32, attn_implementation=attn
            )
        else:
            model = AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(model_dir_or_cfg), attn_implementation=attn
            )
    else:
        cfg = dict(model_dir_or_cfg)
        model_type = cfg.pop("model_type", "llama")
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **cfg), attn_implementation=attn)
    model = model.float()
    model.config.use_cache = False
    return model


def _with_lora(model: Any, config: Mapping[str, Any]) -> Any:
    """The model wrapped in the LoRA adapter the run's config asks for (alpha = 2 x rank, no dropout)."""
    from peft import LoraConfig, get_peft_model

    from cockpit.plan.params import LLAMA_LINEARS, resolve_targets

    targets = resolve_targets(config.get("lora_target", "all"), LLAMA_LINEARS)
    rank = int(config.get("lora_rank", 8))
    return get_peft_model(
        model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets, lora_dropout=0.0, task_type="CAUSAL_LM")
    )


def _synthetic_rows(
    vocab_size: int, config: Mapping[str, Any], *, steps: int, seed: int, warmup_len: int | None, padded: bool = True
) -> list[dict[str, Any]]:
    """Random token rows for ``steps`` optimizer steps, in the order the Trainer will feed them:
    cutoff_len tokens each (the first step's rows ``warmup_len`` long when set); ``padded`` with
    micro-batch > 1: the first row of every micro-batch ends in one padding token."""
    import torch

    micro_batch = int(config.get("per_device_train_batch_size", 1))
    accumulation = int(config.get("gradient_accumulation_steps", 1))
    cutoff_len = int(config.get("cutoff_len", 1024))
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for k in range(micro_batch * accumulation * steps):
        in_first_step = k < micro_batch * accumulation
        length = min(warmup_len, cutoff_len) if (warmup_len and steps > 1 and in_first_step) else cutoff_len
        ids = torch.randint(3, vocab_size, (length,), generator=generator)
        attention_mask = torch.ones(length, dtype=torch.long)
        labels = ids.clone()
        if padded and micro_batch > 1 and k % micro_batch == 0:
            attention_mask[-1] = 0
            labels[-1] = -100
        rows.append({"input_ids": ids, "attention_mask": attention_mask, "labels": labels})
    return rows


def _in_order_trainer(
    model: Any,
    rows: list[dict[str, Any]],
    config: Mapping[str, Any],
    *,
    steps: int,
    seed: int,
    output_dir: str,
    packed: bool = False,
    base: Any = None,
) -> Any:
    """An HF Trainer over ``rows`` in their order (no shuffling), CPU, no saving or logging;
    ``packed``: each micro-batch one padding-free row (the training rank's collator)."""
    import torch
    from transformers import Trainer, TrainingArguments

    class _Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(rows)

        def __getitem__(self, i: int) -> dict:
            return rows[i]

    trainer_base: type[Any] = base or Trainer

    class _InOrder(trainer_base):  # type: ignore[misc,valid-type]  # the rank's Trainer subclass, or HF's
        def _get_train_sampler(self, *a: Any, **k: Any) -> Any:
            return torch.utils.data.SequentialSampler(self.train_dataset)

    from cockpit.config.parity import low_rank_optim
    from cockpit.config.schema import default_config

    # use_galore / use_apollo: HF's galore_* / apollo_* optimizer, as the training rank asks for it
    optimizer = {"optim": str(config.get("optim", "adamw_torch_fused"))}
    optimizer.update(low_rank_optim({**default_config(), **config}) or {})
    args = TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=int(config.get("per_device_train_batch_size", 1)),
        gradient_accumulation_steps=int(config.get("gradient_accumulation_steps", 1)),
        max_steps=steps,
        learning_rate=1e-4,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        gradient_checkpointing=bool(config.get("gradient_checkpointing", False)),
        bf16=bool(config.get("bf16", False)),
        seed=seed,
        **optimizer,
    )
    collator = None
    if packed:
        from transformers import DataCollatorWithFlattening

        from cockpit.data.packing import reads_sample_bounds

        collator = DataCollatorWithFlattening(  # the rank's (cockpit.data.packing.build_collator)
            return_position_ids=True, separator_id=-100, return_flash_attn_kwargs=reads_sample_bounds(model)
        )
    return _InOrder(model=model, args=args, train_dataset=_Rows(), data_collator=collator)
