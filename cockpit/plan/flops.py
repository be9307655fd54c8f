"""Training FLOPs per token, for model FLOPs utilisation (MFU); pure arithmetic, no torch.

The usual convention (PaLM's appendix B, torchtitan's ``get_num_flop_per_token``)::

    model FLOPs per token = 6 * N + 12 * L * H * Q * T

N the parameters of the model's matrix multiplies (every parameter but the input embedding; the LM
head's matmul counts, once, also when it is tied to the embedding; a mixture-of-experts model's N is
its active parameters: the top-k routed experts a token goes to, not all of them, plus the shared
experts and the rest), L layers, H attention heads, Q the
head dimension, T the sequence length the attention spans. 6 * N is a forward (2 N), the gradients of the
activations (2 N) and the gradients of the weights (2 N); 12 * L * H * Q * T is the attention scores and
their weighted sum (4 L H Q T forward, twice that backward), which have no weights.

Frozen weights (LoRA, freeze): their weight-gradient GEMMs are skipped, so the 6 N term becomes
``6 N (2 + s) / 3`` with s the trainable share of the parameters (NeMo's rule); a LoRA adapter's own
parameters are part of N.

Gradient checkpointing recomputes each decoder layer's forward during the backward: work the hardware
does that the model's FLOPs do not count. It is reported apart, as hardware FLOPs (HFU's numerator):
``2 * (L * layer params + adapter) + 4 * L * H * Q * T`` more per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from cockpit.plan.params import Dims, ParamCounts


@dataclass(frozen=True)
class FlopsPerToken:
    """FLOPs per trained token: ``model`` (MFU's numerator) and ``hardware`` (with recomputation)."""

    matmul_params: int  # N
    dense: float  # the 6 N term, scaled for frozen weights
    attention: float  # 12 L H Q T
    recompute: float  # gradient checkpointing's second forward (0 without it)

    @property
    def model(self) -> float:
        return self.dense + self.attention

    @property
    def hardware(self) -> float:
        return self.model + self.recompute


def matmul_params(counts: ParamCounts, adapter: int = 0) -> int:
    """N: every parameter a token runs through but the input embedding (a mixture-of-experts model:
    the top-k routed experts' share of the experts, the shared experts and the rest: ``counts.active``),
    the LM head counted once even when tied, and a LoRA adapter's parameters."""
    head = counts.lm_head or counts.embedding  # tied: the embedding's matrix is the head's too
    return counts.active - counts.embedding - counts.lm_head + head + adapter


def flops_per_token(
    dims: Dims,
    counts: ParamCounts,
    seq_len: float,
    *,
    trainable_share: float = 1.0,
    adapter_params: int = 0,
    recompute: bool = False,
) -> FlopsPerToken:
    """FLOPs per token of one training step (forward + backward) at sequence length ``seq_len``.
    ``trainable_share``: the share of the parameters that get gradients (1.0 full fine-tuning, the
    adapter's share under LoRA); ``adapter_params``: LoRA's parameters (added to N);
    ``recompute``: gradient checkpointing (the hardware figure adds the decoder layers' forward)."""
    share = min(max(float(trainable_share), 0.0), 1.0)
    n = matmul_params(counts, adapter_params)
    heads_x_dim = dims.layers * dims.heads * dims.head_dim
    attention = 12.0 * heads_x_dim * float(seq_len)
    layers_active = counts.layers * counts.per_layer - (counts.experts - counts.experts_active)
    second_forward = 2.0 * (layers_active + adapter_params) + 4.0 * heads_x_dim * float(seq_len)
    return FlopsPerToken(
        matmul_params=n,
        dense=6.0 * n * (2.0 + share) / 3.0,
        attention=attention,
        recompute=second_forward if recompute else 0.0,
    )


def utilisation(flops_per_token: float, tokens_per_s_per_device: float, peak_tflops: float) -> float:
    """Achieved FLOPs/s of one device over its peak: MFU with the model figure, HFU with the hardware one."""
    return flops_per_token * tokens_per_s_per_device / (peak_tflops * 1e12)
