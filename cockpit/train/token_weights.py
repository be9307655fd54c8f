"""Token-weighted SFT losses: LLaMA-Factory's ``use_dft_loss`` and ``use_eaft_loss``.

Both keep the cross-entropy of every labelled token and multiply it by a weight computed from the
token's own logits, taken as a constant (no gradient through it); the sum is then normalised as the
plain loss is (over ``num_items_in_batch`` when given, else the mean over labelled tokens), as
LLaMA-Factory's ``dft_loss_func`` / ``eaft_loss_func`` (``train/trainer_utils.py``) do:

- DFT (Dynamic Fine-Tuning, Wu et al. 2025): the weight is the model's probability of the token,
  ``exp(-cross_entropy)``.
- EAFT: the weight is ``(H / 3) ** eaft_alpha``, ``H`` the entropy of the softmax over the 20 largest
  logits.

A :data:`TokenWeighting` takes one block of fp32 logits ``[n, V]`` and those rows' cross-entropies
``[n]`` and returns the rows' weights ``[n]``, so the chunked loss (:mod:`cockpit.train.chunked_loss`,
a chunk at a time, never the full logits) and the model's own loss over full logits
(:func:`weighted_causal_lm_loss`, where the chunked loss does not apply: FSDP2, ZeRO-3, a scaled head)
weigh the same. The trainer installs either as the model's ``loss_function`` for each forward
(:func:`weighted_model_loss`), so evaluation's loss is weighted too, as in LLaMA-Factory (its
trainer's ``compute_loss_func`` serves both).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from cockpit.train.chunked_loss import IGNORE, summed_lm_loss

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

EAFT_TOP_K = 20  # LLaMA-Factory's: the entropy over the 20 largest logits
EAFT_SCALE = 3.0  # LLaMA-Factory's: the entropy is divided by 3 before the power

TokenWeighting = Callable[[Any, Any], Any]  # (logits [n, V] fp32, cross-entropy [n]) -> weights [n]


def dft_weights(logits: Any, row_loss: Any) -> Any:
    """DFT: each token's probability under the model, ``exp(-cross_entropy)``, detached."""
    return torch.exp(-row_loss.detach())


def eaft_weights(logits: Any, row_loss: Any, alpha: float = 1.0) -> Any:
    """EAFT: ``(entropy of the top-20 softmax / 3) ** alpha``, detached (LLaMA-Factory's
    ``_eaft_cross_entropy``)."""
    with torch.no_grad():
        top = torch.topk(logits.detach(), k=min(EAFT_TOP_K, logits.shape[-1]), dim=-1).values
        log_probs = top - torch.logsumexp(top, dim=-1, keepdim=True)
        entropy = -(log_probs.exp() * log_probs).sum(dim=-1)
        return torch.pow(entropy / EAFT_SCALE, alpha)


def token_weighting(cfg: RunConfig) -> TokenWeighting | None:
    """The weighting a config asks for (``use_dft_loss`` / ``use_eaft_loss``), or None for plain
    cross-entropy. Validation refuses both at once."""
    if cfg.use_dft_loss:
        return dft_weights
    if cfg.use_eaft_loss:
        return functools.partial(eaft_weights, alpha=float(cfg.eaft_alpha))
    return None


def weighted_causal_lm_loss(weighting: TokenWeighting) -> Callable[..., Any]:
    """A model ``loss_function`` over the full logits: HF's ``ForCausalLMLoss`` (shifted labels,
    -100 ignored, fp32) with each token's cross-entropy multiplied by ``weighting``'s weight."""

    def summed(logits: Any, shift_labels: Any, vocab_size: int) -> Any:
        logits = logits.float().reshape(-1, vocab_size)
        targets = shift_labels.reshape(-1)
        row_loss = torch.nn.functional.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="none")
        return torch.where(targets != IGNORE, row_loss * weighting(logits, row_loss), 0.0).sum()

    return summed_lm_loss(summed)


class LossNotCalled(RuntimeError):
    """The model's forward computed no loss through its ``loss_function``: a weighting would be lost."""


@contextlib.contextmanager
def weighted_model_loss(base: Any, loss_function: Callable[..., Any]) -> Iterator[None]:
    """Within: ``base`` (the causal LM itself, under PEFT's and the strategy's wrappers) computes its
    loss with ``loss_function``; a forward with labels that never called it (a model whose forward
    computes its loss some other way) raises :class:`LossNotCalled` rather than train unweighted."""
    calls = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return loss_function(*args, **kwargs)

    base.loss_function = counted  # PreTrainedModel's setter: an instance attribute
    try:
        yield
    finally:
        vars(base).pop("_loss_function", None)
    if not calls:
        raise LossNotCalled(
            f"{type(base).__name__}'s forward computed its loss without its loss_function, so use_dft_loss / "
            "use_eaft_loss cannot weigh it"
        )
