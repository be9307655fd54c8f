"""Padded or padding-free micro-batches: the ``packing`` key resolved, without torch (the planner,
``cockpit check``, ``cockpit tune`` and the training rank share this one rule).

LLaMA-Factory's keys: ``packing: true`` or ``neat_packing: true`` ask for padding-free batches,
``packing: false`` for padded ones. Unset (``auto``, Cockpit's default) means padding-free where it
trains the same samples with the same loss and costs less than padding:

- the micro-batch holds more than one sample (a single sample carries no padding), and
- the attention is FlashAttention (its varlen kernel needs no mask), or the packed row holds at
  most ``AUTO_MAX_PACKED_TOKENS`` (micro-batch x cutoff_len) tokens: SDPA and eager attend over
  the whole row through a block-diagonal mask whose size grows with the square of the row.

Measured on the CPU (``bench/padding_free.py``: SmolLM2-135M, LoRA, forward + backward, micro-batch
4): padding-free took 0.50-0.56x the padded time on alpaca_en rows (cutoff 256-2048), 0.77x and
0.74x on rows of a quarter to all of cutoff_len at 512 and 1024 (packed rows up to 4096 tokens).
Beyond 4096 tokens the mask's square growth is not measured here, so auto pads there.

The training rank also asks the model (``cockpit.data.packing.model_packs``): a model whose
attention does not turn restarting position ids into per-sample attention is padded under auto
and refused under ``packing: true``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

AUTO_MAX_PACKED_TOKENS = 4096
# the attention implementation name of cockpit.train.packed_attention (SDPA once per packed sample)
PACKED_SDPA = "cockpit_packed_sdpa"


# the keys the decision reads (the planner's measurement builds a RunConfig of these from its dict)
PADDING_KEYS = ("packing", "neat_packing", "flash_attn", "per_device_train_batch_size", "cutoff_len")


def packing_asked(cfg: RunConfig) -> bool | None:
    """True / False when the config says so, None for auto (unset)."""
    if cfg.packing or cfg.neat_packing:
        return True
    if cfg.packing is False:
        return False
    return None


def asks_flash_attention(cfg: RunConfig) -> bool:
    return str(cfg.flash_attn or "auto").lower() == "fa2"


def packed_row_tokens(cfg: RunConfig) -> int:
    """The longest padding-free row: micro-batch x cutoff_len tokens."""
    return int(cfg.per_device_train_batch_size or 1) * int(cfg.cutoff_len or 0)


def padding_free(cfg: RunConfig) -> bool:
    """Whether this config's SFT micro-batches are padding-free (see the module doc)."""
    asked = packing_asked(cfg)
    if asked is not None:
        return asked
    if int(cfg.per_device_train_batch_size or 1) <= 1:
        return False
    return asks_flash_attention(cfg) or packed_row_tokens(cfg) <= AUTO_MAX_PACKED_TOKENS


def batching_words(cfg: RunConfig) -> str:
    """How the micro-batches are built, in words (the run log, ``cockpit check``)."""
    asked = packing_asked(cfg)
    how = "padding-free" if padding_free(cfg) else "padded"
    if asked is not None:
        return f"{how} batches (packing: {str(asked).lower()})"
    if int(cfg.per_device_train_batch_size or 1) <= 1:
        return f"{how} batches (packing: auto; one sample per micro-batch has no padding)"
    if asks_flash_attention(cfg):
        return f"{how} batches (packing: auto; FlashAttention's varlen kernel)"
    limit = f"<= {AUTO_MAX_PACKED_TOKENS}" if padding_free(cfg) else f"> {AUTO_MAX_PACKED_TOKENS}"
    return f"{how} batches (packing: auto; micro-batch x cutoff_len = {packed_row_tokens(cfg)} {limit} tokens)"
