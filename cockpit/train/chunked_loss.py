"""The language-model loss without the full logits.

A causal LM's loss needs, at every kept position, the logits over the whole vocabulary: with a
128k vocabulary and 4096 positions that is 2 GiB in fp32, then the loss's log-softmax and the
gradient of both, all alive at once. Here the LM head and the cross-entropy run together, a chunk
of :data:`CHUNK` positions at a time: the chunk's logits (fp32), its log-sum-exp and summed loss,
then the chunk is dropped. Peak memory for the head is one chunk's logits instead of every
position's. The gradients come one of two ways:

- the head's weight frozen (LoRA, freeze, QLoRA: the usual case): the forward already holds each
  chunk's logits, so it turns them into ``softmax - one_hot`` there and keeps only the gradient of
  the hidden states ([N, H], in place of the hidden states themselves); backward scales it by the
  incoming gradient, a scalar. Two head matmuls per chunk, as with the full logits (Liger's fused
  linear cross-entropy does the same);
- the head's weight trains (full fine-tuning, a trained tied embedding): backward recomputes each
  chunk's logits from the saved hidden states, then multiplies out the gradients of the hidden
  states, the weight and the bias chunk by chunk. The price is the head's matmul once more, and no
  ``[V, H]`` gradient is held from forward to backward.

The same numbers as the model's own loss (HF's ``ForCausalLMLoss``): labels shifted by one
(``shift_labels`` when given), ``-100`` ignored, the sum over ``num_items_in_batch`` when given
else the mean over labelled tokens; the matmul in the model's dtype (the autocast dtype under
autocast) and the loss in fp32, as ``lm_head(h).float()`` does.

How it hooks in (:func:`lm_loss_without_logits`): for one forward of the whole model (through
PEFT's, DDP's and accelerate's wrappers, so nothing they do is skipped), the model's ``lm_head``
hands back its input (the hidden states at the kept positions) and the model's ``loss_function``
is this chunked loss, which reads the head's weight. The model's own forward then returns this
loss, the Trainer normalises and scales it as before, and an MoE's router loss is added as before.
That is exact only for a model whose forward goes straight from ``lm_head`` to ``loss_function``
(no softcapping, logit scale or multiplier in between): :func:`plain_lm_head` says which do, by
model type (checked against transformers' sources) and config; anything else keeps the logits.
TRL's ``chunked_nll``, Liger's fused linear cross-entropy and torchtune's
``CEWithChunkedOutputLoss`` do the same thing their own ways.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cockpit.models.lm_head import CHUNK, PLAIN, model_why_not, scaled_by

IGNORE = -100


def base_model(model: Any) -> Any:
    """The causal LM inside a PEFT model (the model itself otherwise)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def plain_lm_head(model: Any) -> tuple[Any, str]:
    """``(lm_head, "")`` when the chunked loss is exact for ``model`` (unwrapped from DDP etc.; a PEFT
    model is looked through), else ``(None, why not)``."""
    from transformers.loss.loss_utils import LOSS_MAPPING

    base = base_model(model)
    config = getattr(base, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in PLAIN or not type(base).__module__.startswith("transformers.models."):
        return (
            None,
            f"model type {model_type!r} ({type(base).__name__}) is not known to go straight from lm_head to the loss",
        )
    why = model_why_not(model_type, scaled_by(config))
    if why:
        return None, why
    head = getattr(base, "lm_head", None)
    if head is None or type(head) is not torch.nn.Linear:  # PEFT's LoRA / modules_to_save / trainable tokens, bnb, ...
        return None, f"lm_head is a {type(head).__module__}.{type(head).__qualname__}, not a plain Linear"
    if head.out_features != getattr(config, "vocab_size", None):
        return None, "lm_head's outputs are not the config's vocabulary"
    if "forward" in vars(head) or head._forward_hooks or head._forward_pre_hooks:
        return None, "lm_head has hooks (accelerate's offload, a probe)"
    weight = head.weight
    if type(weight.data) is not torch.Tensor or hasattr(weight, "ds_id") or weight.is_meta:
        return None, "lm_head's weight is sharded (FSDP2, ZeRO-3, tensor parallel)"
    if "_loss_function" in vars(base) or base.loss_function is not LOSS_MAPPING["ForCausalLM"]:
        return None, "the model has its own loss function"
    return head, ""


def _compute_dtype(hidden: Any, weight: Any) -> Any:
    """The dtype ``lm_head(hidden)`` would multiply in: autocast's when it is on, else the weight's."""
    kind = hidden.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def _chunk_logits(hidden: Any, weight: Any, bias: Any) -> Any:
    logits = hidden @ weight.t()
    if bias is not None:
        logits = logits + bias
    return logits.float()


def _lse_exp_(logits: Any) -> tuple[Any, Any]:
    """Each row's logsumexp of a chunk's fp32 logits, which are overwritten by ``exp(logits - row max)``
    (returned second: their row sums are the softmax's denominators). One fp32 buffer per chunk:
    ``torch.logsumexp`` allocates a second one for ``logits - max``."""
    top = logits.amax(dim=1, keepdim=True)
    sums = logits.sub_(top).exp_().sum(dim=1)
    return sums.log().add_(top.squeeze(1)), sums


def _softmax_minus_one_hot_(logits: Any, lse: Any, targets: Any, scale: Any, weights: Any) -> Any:
    """The gradient of ``lse - logits[target]`` with respect to a chunk's fp32 logits, made in place of
    them: ``(softmax - one_hot(target)) x scale`` per row (``scale``: 0 on ignored rows), times each
    row's weight when given (the weights are constants: d(w x loss) = w x d(loss))."""
    return _minus_one_hot_(logits.sub_(lse.unsqueeze(1)).exp_(), targets, scale, weights)


def _minus_one_hot_(grad: Any, targets: Any, scale: Any, weights: Any) -> Any:
    """``(softmax - one_hot(target)) x scale (x weights)`` made in place of the chunk's softmax ``grad``."""
    grad.scatter_add_(1, targets.clamp(min=0).unsqueeze(1), torch.full_like(grad[:, :1], -1.0))
    if weights is not None:
        scale = scale * weights
    return grad.mul_(scale.unsqueeze(1))


class ChunkedLinearCrossEntropy(torch.autograd.Function):  # type: ignore[misc]  # torch.autograd.Function is Any here (follow_imports = skip)
    """``sum(cross_entropy(hidden @ weight.T + bias, targets))`` over the rows whose target is not
    -100, without the ``[rows, vocab]`` logits: ``hidden`` [N, H], ``weight`` [V, H], ``bias`` [V] or
    None, ``targets`` [N]. Returns the fp32 sum (a scalar). With ``weighting`` (a
    :data:`cockpit.train.token_weights.TokenWeighting`: a chunk's fp32 logits and its rows' losses in,
    each row's weight out, taken as a constant) the sum is of ``weight x cross_entropy``. With
    ``grad_now`` (the weight frozen, a backward to follow) the gradients are made in forward (see the
    module doc)."""

    @staticmethod
    def forward(
        ctx: Any, hidden: Any, weight: Any, bias: Any, targets: Any, chunk: int, weighting: Any, grad_now: bool
    ) -> Any:
        dtype = _compute_dtype(hidden, weight)
        need_b = grad_now and bias is not None and ctx.needs_input_grad[2]
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            total = torch.zeros((), dtype=torch.float32, device=hidden.device)
            lse = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
            row_weights = None if weighting is None else torch.empty_like(lse)
            grad_h = torch.empty_like(hidden) if grad_now else None
            grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
            for start in range(0, hidden.shape[0], chunk):
                logits = _chunk_logits(h[start : start + chunk], w, b)
                t = targets[start : start + chunk]
                keep = t != IGNORE
                picked = logits.gather(1, t.clamp(min=0).unsqueeze(1)).squeeze(1)
                if row_weights is None:  # the logits are not read again: exp'd in place
                    row_lse, sums = _lse_exp_(logits)
                else:  # the weighting reads the chunk's logits
                    row_lse, sums = torch.logsumexp(logits, dim=-1), None
                lse[start : start + chunk] = row_lse
                row_loss = row_lse - picked
                weights = None
                if row_weights is not None:
                    row_weights[start : start + chunk] = weights = weighting(logits, row_loss)
                    row_loss = row_loss * weights
                total += torch.where(keep, row_loss, 0.0).sum()
                if grad_h is not None:  # grad_now: the logits become their own gradient, for an incoming gradient of 1
                    scale = torch.where(keep, 1.0, 0.0)
                    grad = (
                        _minus_one_hot_(logits.div_(sums.unsqueeze(1)), t, scale, weights)
                        if sums is not None
                        else _softmax_minus_one_hot_(logits, row_lse, t, scale, weights)
                    )
                    if grad_b is not None:
                        grad_b += grad.sum(0)
                    grad_h[start : start + chunk] = grad.to(dtype) @ w
                    del grad
                del logits
        if grad_now:
            ctx.save_for_backward(grad_h, grad_b)
        else:
            ctx.save_for_backward(hidden, weight, bias, targets, lse, row_weights)
        ctx.chunk, ctx.dtype, ctx.grad_now = chunk, dtype, grad_now
        ctx.bias_dtype = None if bias is None else bias.dtype
        return total

    @staticmethod
    def backward(ctx: Any, grad_total: Any) -> Any:
        if ctx.grad_now:  # the loss is linear in what comes back: scale the gradients made in forward
            grad_h, grad_b = ctx.saved_tensors
            grad_h = (grad_h.float() * grad_total).to(grad_h.dtype)
            grad_b = None if grad_b is None else (grad_b * grad_total).to(ctx.bias_dtype)
            return grad_h, None, grad_b, None, None, None, None
        hidden, weight, bias, targets, lse, row_weights = ctx.saved_tensors
        dtype, chunk = ctx.dtype, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = grad_w = grad_b = None
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            b = None if bias is None else bias.to(dtype)
            if need_h:
                grad_h = torch.empty_like(hidden)
            if need_w:
                grad_w = torch.zeros(weight.shape, dtype=dtype, device=weight.device)
            if need_b:
                grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device)
            for start in range(0, hidden.shape[0], chunk):
                stop = start + chunk
                t = targets[start:stop]
                keep = t != IGNORE
                logits = _chunk_logits(h[start:stop], w, b)
                weights = None if row_weights is None else row_weights[start:stop]
                grad = _softmax_minus_one_hot_(logits, lse[start:stop], t, torch.where(keep, grad_total, 0.0), weights)
                if need_b:
                    grad_b += grad.sum(0)
                g = grad.to(dtype)
                del grad
                if need_h:
                    grad_h[start:stop] = g @ w
                if grad_w is not None:  # need_w
                    grad_w.addmm_(g.t(), h[start:stop])
                del g
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def chunked_cross_entropy_sum(
    hidden: Any, weight: Any, bias: Any, targets: Any, chunk: int = CHUNK, weighting: Any = None
) -> Any:
    """The summed token cross-entropy of ``hidden`` [..., H] through the head (``weight``, ``bias``)
    against ``targets`` [...] (-100 ignored), chunk by chunk, each token's weighted by ``weighting``
    when given (see :class:`ChunkedLinearCrossEntropy`)."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    targets = targets.reshape(-1).to(flat.device)
    # the gradients in forward when the head's weight is frozen and a backward will follow
    grad_now = torch.is_grad_enabled() and flat.requires_grad and not weight.requires_grad
    return ChunkedLinearCrossEntropy.apply(flat, weight, bias, targets, int(chunk), weighting, grad_now)


def summed_lm_loss(summed: Callable[[Any, Any, int], Any]) -> Callable[..., Any]:
    """A model ``loss_function`` with HF's ``ForCausalLMLoss`` signature and normalisation around
    ``summed(logits, shift_labels, vocab_size)``, the fp32 sum of the labelled tokens' losses: labels
    shifted by one (``shift_labels`` when given), ``-100`` ignored, the sum over ``num_items_in_batch``
    when given, else the mean over labelled tokens."""

    def loss(
        logits: Any,
        labels: Any,
        vocab_size: int,
        num_items_in_batch: Any = None,
        ignore_index: int = IGNORE,
        shift_labels: Any = None,
        **kwargs: Any,
    ) -> Any:
        if ignore_index != IGNORE:
            raise ValueError(f"Cockpit's LM losses ignore -100 only (got ignore_index={ignore_index})")
        if shift_labels is None:
            shift_labels = torch.nn.functional.pad(labels, (0, 1), value=IGNORE)[..., 1:]
        shift_labels = shift_labels.to(logits.device)
        total = summed(logits, shift_labels, vocab_size)
        if num_items_in_batch is None:
            return total / (shift_labels != IGNORE).sum()  # the mean over labelled tokens (0/0: nan, as HF)
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    return loss


def causal_lm_loss(head: Any, chunk: int = CHUNK, weighting: Any = None) -> Any:
    """A model ``loss_function`` that takes the hidden states as its ``logits`` and puts them through
    ``head`` chunk by chunk: the numbers of HF's ``ForCausalLMLoss`` (with ``weighting``: of the
    token-weighted loss, :func:`cockpit.train.token_weights.weighted_causal_lm_loss`)."""

    def summed(hidden: Any, shift_labels: Any, vocab_size: int) -> Any:
        if head.weight.shape[0] != vocab_size:
            raise ValueError(f"lm_head has {head.weight.shape[0]} outputs, the loss expects {vocab_size}")
        return chunked_cross_entropy_sum(hidden, head.weight, head.bias, shift_labels, chunk, weighting)

    return summed_lm_loss(summed)


def _hidden_states(hidden: Any) -> Any:
    return hidden


@contextlib.contextmanager
def lm_loss_without_logits(model: Any, head: Any, chunk: int = CHUNK, weighting: Any = None) -> Iterator[None]:
    """Within: a forward of ``model`` (any wrapper around a :func:`plain_lm_head` model) with labels
    returns the chunked loss (token-weighted by ``weighting`` when given); its ``logits`` output is the
    hidden states."""
    base = base_model(model)
    if base.lm_head is not head:
        raise ValueError("the chunked loss's lm_head is not this model's")
    head.forward = _hidden_states
    base.loss_function = causal_lm_loss(head, chunk, weighting)  # PreTrainedModel's setter: an instance attribute
    try:
        yield
    finally:
        del head.forward
        vars(base).pop("_loss_function", None)
