"""Batches for training: padded or padding-free packed, and length grouping.

Which one a config trains on is ``cockpit.data.padding.padding_free`` (``packing`` /
``neat_packing``, LLaMA-Factory's keys; unset: auto, padding-free where it is cheaper). Padding-free
means per-sample attention: each micro-batch's samples are concatenated into one row by
transformers' ``DataCollatorWithFlattening``, with ``position_ids`` restarting at 0 for every
sample and the first label of each sample set to -100 (never predicted from the previous
sample). The rank's SDPA model attends once per sample (``cockpit.train.packed_attention``,
reading the samples' bounds, ``cu_seq_lens``, from the collator); FlashAttention reads the same
bounds (its varlen kernel); eager attention gets transformers' block-diagonal causal mask
(``masking_utils.find_packed_sequence_indices``, used when no ``attention_mask`` is passed and
there is no KV cache). Attention therefore never
crosses samples (unlike LLaMA-Factory's plain ``packing``, which lets a packed block attend
across samples); the micro-batch keeps its samples, so every sample is trained on with its
full loss and the per-token mean is the padded batch's.

``group_by_length`` (HF's key) puts samples of similar length into the same micro-batch
(transformers' ``LengthGroupedSampler``: less padding, same samples per epoch).

torch / transformers are imported inside the functions (``cockpit check`` imports this module).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from cockpit.data.padding import PACKED_SDPA, asks_flash_attention, packing_asked, padding_free
from cockpit.errors import InputError, Problem
from cockpit.models.vlm import composite_of

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


def reads_sample_bounds(model: Any) -> bool:
    """Whether the model's attention reads the packed samples' bounds (``cu_seq_lens``) from the
    batch: FlashAttention's varlen kernel, or Cockpit's per-sample SDPA (train/packed_attention)."""
    impl = str(getattr(getattr(model, "config", None), "_attn_implementation", None) or "")
    return "flash" in impl or impl == PACKED_SDPA


def model_packs(model_config: Any, flash: bool = False) -> bool:
    """Whether this model's attention turns restarting position ids into per-sample attention:
    FlashAttention's varlen path, or a modeling module that builds its masks with transformers'
    ``masking_utils`` (``create_causal_mask`` finds the packed samples from position ids)."""
    if flash:
        return True
    from transformers import AutoModelForCausalLM

    try:
        model_class = AutoModelForCausalLM._model_mapping[type(model_config)]
    except (KeyError, ValueError):
        return False
    module = sys.modules.get(model_class.__module__)
    return module is not None and hasattr(module, "create_causal_mask")


def resolve_for_run(cfg: RunConfig, model_ref: Any, log=print) -> RunConfig:
    """``resolve_for_model`` with the config of the run's model (``cockpit.models.resolve``'s ref),
    read only when the config would pack."""
    if not padding_free(cfg):
        return cfg
    from cockpit.models.resolve import load_model_config

    return resolve_for_model(cfg, load_model_config(cfg, model_ref), log)


def resolve_for_model(cfg: RunConfig, model_config: Any, log=print) -> RunConfig:
    """The config with ``packing`` decided for this model: auto falls back to padded batches (said
    in the log) for a model that cannot attend per sample in a packed row; ``packing: true`` there
    is an input error (its samples would attend to each other)."""
    if not padding_free(cfg):
        return cfg
    model_type = getattr(model_config, "model_type", "this model")
    vlm = composite_of(model_config) is not None  # its images' features go to their tokens: padded rows only, so far
    if not vlm and model_packs(model_config, asks_flash_attention(cfg)):
        return cfg
    if packing_asked(cfg) and vlm:
        raise InputError(
            Problem(f"{model_type}: a vision-language model trains on padded batches (packing: false)", key="packing")
        )
    if packing_asked(cfg):
        raise InputError(
            Problem(
                f"{model_type}'s attention does not keep packed samples apart (no masking_utils causal mask); "
                "use packing: false or flash_attn: fa2",
                key="packing",
            )
        )
    log(f"packing auto: {model_type} cannot attend per sample in a packed row; padded batches")
    return cfg.replace(packing=False)


def build_collator(cfg: RunConfig, tokenizer: Any, model: Any = None) -> Any:
    """The Trainer's data collator for this config."""
    if padding_free(cfg):
        from transformers import DataCollatorWithFlattening

        return DataCollatorWithFlattening(
            return_position_ids=True,
            separator_id=-100,
            return_flash_attn_kwargs=reads_sample_bounds(model),
        )
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)


def batching_arguments(cfg: RunConfig) -> dict[str, Any]:
    """TrainingArguments for this config's batching: the sampler, and how tokens are counted
    (a packed batch has no padding and no attention mask: every token counts)."""
    kwargs: dict[str, Any] = {"include_num_input_tokens_seen": "all" if padding_free(cfg) else "non_padding"}
    if cfg.group_by_length:
        kwargs["train_sampling_strategy"] = "group_by_length"
    return kwargs


def padded_tokens(lengths: list[int], micro_batch: int) -> tuple[int, int]:
    """(real tokens, tokens a padded batch computes on) for ``lengths`` in order, ``micro_batch``
    at a time: the padding waste packing removes (``cockpit check`` reports it)."""
    real = sum(lengths)
    padded = 0
    for i in range(0, len(lengths), micro_batch):
        chunk = lengths[i : i + micro_batch]
        padded += max(chunk) * len(chunk)
    return real, padded
