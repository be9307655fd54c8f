"""What a training step needs to know about its batch as Python numbers, found by the collator on the host
before the batch moves to the device, so the step never waits for the device to read them back
(bench/host_syncs.py counts such reads: each one, on a GPU, stops the host running ahead of the kernels).

- :data:`TOKENS`: the batch's tokens as HF's Trainer counts them for ``num_input_tokens_seen`` (tokens/s
  reads it): every token of a padding-free row, else the non-padding ones. HF's own count is a device
  ``.item()`` every step.
- :data:`BOUNDS`: a padding-free row's sample boundaries (its ``cu_seq_lens_q``) as ints, which the
  per-sample attention (:mod:`cockpit.train.packed_attention`) reads in every forward; reading them from the
  device tensor was a ``.tolist()`` every step.

:class:`WithHostFacts` wraps the training collator (``CockpitTrainer.get_train_dataloader``); the trainer
takes the keys out of the batch before the model sees it.
"""

from __future__ import annotations

from typing import Any

TOKENS = "cockpit_tokens"
BOUNDS = "cockpit_sample_bounds"
KEYS = (TOKENS, BOUNDS)


def batch_tokens(batch: Any, how: str, pad_token_id: int | None) -> int | None:
    """The batch's tokens as ``Trainer._track_num_input_tokens`` counts them (``how``:
    ``include_num_input_tokens_seen``); None when HF would not count (``no``, or no input_ids)."""
    ids = batch.get("input_ids")
    if how in ("no", False, None) or ids is None:
        return None
    if how == "non_padding":
        if "attention_mask" in batch:
            return int(batch["attention_mask"].sum())
        if pad_token_id is not None:
            return int((ids != pad_token_id).sum())
    return int(ids.numel())


class WithHostFacts:
    """A training collator whose batches also carry :data:`TOKENS` and, padding-free, :data:`BOUNDS`."""

    def __init__(self, collate: Any, count_tokens: str, pad_token_id: int | None):
        self.collate = collate
        self.count_tokens = count_tokens
        self.pad_token_id = pad_token_id

    def __call__(self, features: Any) -> Any:
        batch = self.collate(features)
        if isinstance(batch, list):  # GRPO's collator hands the rows on as a list: the trainer tokenizes them
            return batch
        tokens = batch_tokens(batch, self.count_tokens, self.pad_token_id)
        if tokens is not None:
            batch[TOKENS] = tokens
        bounds = batch.get("cu_seq_lens_q")
        if bounds is not None:
            batch[BOUNDS] = [int(b) for b in bounds.tolist()]  # a host tensor here: no wait
        return batch
