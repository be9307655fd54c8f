"""Batches for training: padded (the default) or padding-free packed, and length grouping.

``packing`` / ``neat_packing`` (LLaMA-Factory's keys) both select padding-free packing with
per-sample attention: each micro-batch's samples are concatenated into one row by
transformers' ``DataCollatorWithFlattening``, with ``position_ids`` restarting at 0 for every
sample and the first label of each sample set to -100 (never predicted from the previous
sample). transformers turns restarting position ids into per-sample attention itself: on the
CPU and for SDPA/eager a block-diagonal causal mask (``masking_utils.find_packed_sequence_indices``,
used when no ``attention_mask`` is passed and there is no KV cache), with FlashAttention the
varlen kernel (the collator then also returns ``cu_seq_lens``). Attention therefore never
crosses samples (unlike LLaMA-Factory's plain ``packing``, which lets a packed block attend
across samples); the micro-batch keeps its samples, so every sample is trained on with its
full loss and the per-token mean is the padded batch's.

``group_by_length`` (HF's key) puts samples of similar length into the same micro-batch
(transformers' ``LengthGroupedSampler``: less padding, same samples per epoch).

torch / transformers are imported inside the functions (``cockpit check`` imports this module).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def packing_enabled(cfg: Mapping[str, Any]) -> bool:
    return bool(cfg.get("packing") or cfg.get("neat_packing"))


def uses_flash_attention(model: Any) -> bool:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None) or ""
    return "flash" in str(impl)


def build_collator(cfg: Mapping[str, Any], tokenizer: Any, model: Any = None) -> Any:
    """The Trainer's data collator for this config."""
    if packing_enabled(cfg):
        from transformers import DataCollatorWithFlattening

        return DataCollatorWithFlattening(
            return_position_ids=True,
            separator_id=-100,
            return_flash_attn_kwargs=uses_flash_attention(model),
        )
    from transformers import DataCollatorForSeq2Seq

    return DataCollatorForSeq2Seq(tokenizer, padding=True, label_pad_token_id=-100)


def batching_arguments(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """TrainingArguments for this config's batching: the sampler, and how tokens are counted
    (a packed batch has no padding and no attention mask: every token counts)."""
    kwargs: dict[str, Any] = {"include_num_input_tokens_seen": "all" if packing_enabled(cfg) else "non_padding"}
    if cfg.get("group_by_length"):
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
