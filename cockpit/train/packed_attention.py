"""Per-sample SDPA for padding-free rows: each packed sample attends causally to itself alone.

transformers' own SDPA path turns a padding-free row (samples concatenated, position ids
restarting) into one block-diagonal mask over the whole row: SDPA then computes every query
against every key of the row (micro-batch x cutoff_len squared, most of it masked out) and
cannot use its causal fast path. This attention function, registered with transformers'
``AttentionInterface`` as ``cockpit_packed_sdpa``, calls SDPA once per sample with
``is_causal=True`` instead (the sample boundaries are the collator's ``cu_seq_lens_q``, the
same ones FlashAttention's varlen kernel reads): the same attention, the work of the samples
alone. bench/padding_free.py measures it (its per-sample variant).

Everything else (padded batches, evaluation, a sliding window, attention sinks, a position
bias) goes to transformers' ``sdpa_attention_forward`` with the mask transformers built,
unchanged.
"""

from __future__ import annotations

from typing import Any

from cockpit.data.padding import PACKED_SDPA as NAME

_bounds_cache: list[Any] = [None, None]  # [the cu_seq_lens tensor of this forward, its bounds as ints]


def sample_bounds(cu_seq_lens: Any) -> list[int]:
    """``cu_seq_lens`` as Python ints, read once per forward (every layer gets the same tensor)."""
    if _bounds_cache[0] is not cu_seq_lens:
        _bounds_cache[0], _bounds_cache[1] = cu_seq_lens, [int(b) for b in cu_seq_lens.tolist()]
    bounds: list[int] = _bounds_cache[1]
    return bounds


def prime_bounds(cu_seq_lens: Any, bounds: list[int]) -> None:
    """The bounds of the forward about to run, found on the host by the collator
    (:mod:`cockpit.train.host_facts`): :func:`sample_bounds` then reads no device tensor."""
    if cu_seq_lens is not None:
        _bounds_cache[0], _bounds_cache[1] = cu_seq_lens, list(bounds)


def _per_sample_applies(module: Any, query: Any, kwargs: dict[str, Any]) -> bool:
    if kwargs.get("cu_seq_lens_q") is None or query.shape[0] != 1:
        return False
    if not getattr(module, "is_causal", True) or getattr(module, "sliding_window", None):
        return False
    return all(kwargs.get(k) is None for k in ("position_bias", "s_aux", "sinks", "softcap"))


def packed_sdpa_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function signature: (batch, heads, seq, head_dim) in, the
    attention output as (batch, seq, heads, head_dim) and no weights out."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not _per_sample_applies(module, query, kwargs):
        whole: tuple[Any, None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
        return whole
    bounds = sample_bounds(kwargs["cu_seq_lens_q"])
    outputs = [
        sdpa_attention_forward(
            module,
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            None,
            dropout=dropout,
            scaling=scaling,
            is_causal=True,
        )[0]
        for start, end in zip(bounds[:-1], bounds[1:])
        if end > start
    ]
    return torch.cat(outputs, dim=1), None


def register() -> None:
    """Make ``cockpit_packed_sdpa`` a name transformers knows (its masks: SDPA's)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, packed_sdpa_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_for_padding_free(model: Any) -> bool:
    """Switch a model that attends with SDPA to the per-sample path (before PEFT wraps it);
    True when it did. Other kernels (eager, FlashAttention, a custom one) stay as they are."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    register()
    model.set_attn_implementation(NAME)
    return True
