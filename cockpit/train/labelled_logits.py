"""Logits only where the loss is.

An SFT loss covers the answer tokens; an HF causal LM still computes the vocabulary-wide logits
(and the loss's fp32 copy of them) at every position, prompt included, and the loss then ignores
the prompt's. HF's models take ``logits_to_keep`` (a 1-D tensor of positions) in ``forward``:
given the positions whose next token carries a label, they run the LM head on those positions
only. The loss is unchanged: the same (logit, target) pairs, through the model's own loss
function with the Trainer's ``num_items_in_batch``.

The labels are rewritten to match: HF's loss shifts labels by one (the logit at ``j`` predicts
label ``j + 1``), so the kept positions ``p_0 < ... < p_{K-1}`` are followed by one more position
(the row's last, which predicts nothing) and the new labels are ``[-100, y(p_0), ..., y(p_{K-1})]``
where ``y(p)`` is the original label at ``p + 1``. In a padded micro-batch the positions are the
union over its rows (a row's own ignored positions stay -100).
"""

from __future__ import annotations

import inspect
from typing import Any

IGNORE = -100
WORTH_IT = 0.9  # keep the full logits when more than this share of positions carries a label


def accepts_logits_to_keep(model: Any) -> bool:
    """Whether the (unwrapped: PEFT's base) model's forward takes ``logits_to_keep``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(type(base).forward).parameters
    except (TypeError, ValueError):
        return False


POSITIONS = "cockpit_labelled_positions"  # a training batch's kept positions, found by its collator


def labelled_positions(labels: Any) -> Any:
    """The positions whose next token carries a label (1-D), or an empty tensor when every logit
    stays (no labels to skip, or too few to be worth it). ``nonzero`` sizes its output from the
    data: on a device tensor it waits for the device, so the collator asks it on the host."""
    keep = (labels[:, 1:] != IGNORE).any(dim=0).nonzero().flatten()
    if keep.numel() == 0 or keep.numel() > WORTH_IT * (labels.shape[1] - 1):
        return keep[:0]
    return keep


class WithLabelledPositions:
    """A training collator whose batches also carry :data:`POSITIONS` (on the host, before the
    batch moves to the device: no device sync in the step; bench/host_syncs.py counts them)."""

    def __init__(self, collate: Any):
        self.collate = collate

    def __call__(self, features: Any) -> Any:
        batch = self.collate(features)
        labels = batch.get("labels")
        if labels is not None and labels.dim() == 2 and labels.shape[1] >= 2:
            batch[POSITIONS] = labelled_positions(labels)
        return batch


def labelled_positions_only(inputs: dict[str, Any], positions: Any = None) -> dict[str, Any]:
    """``inputs`` with ``logits_to_keep`` and the matching labels (see the module doc); unchanged
    when there are no labels, none to skip, or too few to be worth it. ``positions``: the collator's
    :func:`labelled_positions` of these labels (found here, on the labels' device, when None)."""
    import torch

    labels = inputs.get("labels")
    if labels is None or labels.dim() != 2 or labels.shape[1] < 2 or "logits_to_keep" in inputs:
        return inputs
    keep = labelled_positions(labels) if positions is None else positions.to(labels.device, non_blocking=True)
    if keep.numel() == 0:
        return inputs
    length = labels.shape[1]
    positions = torch.cat([keep, keep.new_tensor([length - 1])])
    kept_labels = torch.cat([labels.new_full((labels.shape[0], 1), IGNORE), labels[:, 1:][:, keep]], dim=1)
    return {**inputs, "labels": kept_labels, "logits_to_keep": positions}
