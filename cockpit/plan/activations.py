"""Activation memory of one micro-batch: bytes per token of a decoder layer and outside the layers
(Korthikanti et al. 2022 sec. 4.1, redone for HF's Llama / Qwen2 / Mistral: see
:mod:`cockpit.plan.estimate`'s sources), the saved layers under gradient checkpointing, the logits
(all positions, or one chunk of the chunked loss) and the autocast and dequantization copies beside them."""

from __future__ import annotations

from dataclasses import dataclass

from cockpit.models.lm_head import CHUNK, model_why_not
from cockpit.plan.params import Dims, ParamCounts
from cockpit.plan.spec import RunSpec


def activation_terms(run: RunSpec, d: Dims, n_targets: int) -> dict[str, float]:
    """Activation bytes *per token* (Korthikanti-style accounting adapted to HF Llama)."""
    c = run.compute_bytes
    h, i, qd, kvd, a = d.hidden, d.intermediate, d.q_dim, d.kv_dim, d.heads
    # packing: one row of up to micro_batch x cutoff_len tokens; transformers builds its block-diagonal
    # bool mask (T x T, one for all layers) unless fa2 (varlen). SDPA runs once per sample
    # (cockpit.train.packed_attention: causal, no mask, k/v not repeated, the outputs concatenated);
    # eager attends over the whole row through the mask.
    s = run.micro_batch * run.cutoff_len if run.packing else run.cutoff_len
    packed_mask = run.packing and run.attn != "fa2"
    per_sample = run.packing and run.attn == "sdpa"
    plain = run.zero is None and run.fsdp is None
    full = run.finetuning_type == "full"
    # With torch.autocast and fp32 trainable weights (full FT outside DeepSpeed/FSDP), the embedding
    # output and so the residual stream stay fp32, and each linear casts its input to half.
    residual_fp32 = (not run.mixed) or (plain and full)
    nb = 4 if residual_fp32 else c
    norm_trainable = full or run.finetuning_type == "freeze"
    # RMSNorm: fp32 input (or its fp32 copy) for pow/mul, normalized x if its weight trains,
    # output (input of q/k/v or gate/up) unless autocast copies are kept instead.
    per_norm = 4 * h + (nb * h if norm_trainable else 0) + (0 if (run.mixed and residual_fp32) else nb * h)
    autocast_copies = 5 * c * h if (run.mixed and residual_fp32) else 0  # q,k,v and gate,up inputs
    mask = (run.micro_batch > 1 or packed_mask) and run.attn != "fa2"  # padded batches carry an attention mask
    if run.attn == "eager":
        kv_eff = qd  # repeat_kv to all heads
        attn = c * (qd + 2 * kv_eff + qd) + 4 * a * s + (c * a * s if c != 4 else 0) + c * qd
    elif per_sample:  # q, k, v, each sample's output and their concatenation (o_proj's input), logsumexp
        attn = c * (qd + 2 * kvd + qd + qd) + 4 * a
    else:
        kv_eff = qd if (run.attn == "sdpa" and mask) else kvd  # enable_gqa only without a mask
        attn = c * (qd + 2 * kv_eff + qd) + 4 * a  # q, k, v, output (= o_proj input), logsumexp
        if mask and run.attn == "sdpa" and not run.packing:
            attn += c * s  # boolean mask turned into an additive float mask, saved
    mlp = 4 * i * c if not d.experts else routed_mlp_bytes(run, d)
    lora = n_targets * run.lora_rank * c if run.finetuning_type == "lora" else 0
    layer = 2 * per_norm + autocast_copies + attn + mlp + lora + 2 * 4  # + two rsqrt values
    ckpt_layer = nb * h  # checkpointing keeps each layer's input only
    lm_head_trains = full
    # once the head and the final norm have run backward (the recompute of the last layer on), only
    # RoPE's cos/sin, the packed row's T x T bool mask (T bytes per token) and a few scalars are left
    nonlayer_in_backward = 2 * d.head_dim * 4 + 16 + (s if packed_mask else 0)
    nonlayer = 4 * h + ((nb * h + nb * h) if lm_head_trains else 0) + nonlayer_in_backward
    # logits: at the start of backward the fp32 log_softmax (saved), its gradient and the gradient of
    # the logits are alive together: 3 x 4 B x vocab (the forward's logits + fp32 copy are fewer).
    logits = 12 * d.vocab
    if run.liger:  # Liger's fused linear cross-entropy: chunks of tokens, the fp32 logits never exist whole
        logits = 0
    # backward of one layer: gradient of the hidden state in and out, and at the MLP's peak three
    # MLP-sized gradients (down_proj's input gradient, or with LoRA its base and adapter parts and
    # their sum; then those of silu(gate) and up) while down_proj's input, already used, is freed:
    # 3 new minus 1 saved (bench/lora_layer_memory.py at Llama-3.1-8B's width)
    bwd_transient = c * (2 * h + 2 * i) + (4 * a * s if run.attn == "eager" else 0)
    return {
        "layer": layer,
        "ckpt_layer": ckpt_layer,
        "nonlayer": nonlayer,
        "nonlayer_in_backward": nonlayer_in_backward,
        "logits": logits,
        "bwd_transient": bwd_transient,
    }


def routed_mlp_bytes(run: RunSpec, d: Dims) -> float:
    """A mixture-of-experts layer's MLP, bytes per token: each of the top-k experts it goes to keeps
    the gathered input, gate and up, their product, and its output before the router's weight (the
    dense MLP's four intermediate tensors and two hidden-sized ones, per chosen expert), the shared experts
    theirs, and the router its softmax (fp32, saved) and, with ``moe_aux_loss_coef``, its logits (kept
    for the aux loss)."""
    c = run.compute_bytes
    routed = d.top_k * (4 * d.expert_intermediate + 2 * d.hidden) * c
    shared = d.shared_experts * 4 * d.expert_intermediate * c
    return routed + shared + router_bytes(run, d)


def router_bytes(run: RunSpec, d: Dims) -> float:
    """The router's bytes per token and layer: the fp32 softmax saved for backward, the logits kept
    until the loss with ``moe_aux_loss_coef`` (transformers' output_router_logits)."""
    return 4 * d.experts + (run.compute_bytes * d.experts if run.router_logits_kept else 0)


def merged_experts_bytes(run: RunSpec, d: Dims, counts: ParamCounts) -> float:
    """LoRA on the fused expert tensors (PEFT's ``target_parameters``): each forward of an MoE layer
    builds its experts' merged weights (W + BA, the whole stack: ``parametrize.cached``), which the
    expert matmuls save until that layer's backward: one layer's expert weights in the compute dtype."""
    every = str(run.lora_target or "all").strip().lower() == "all"
    if run.finetuning_type != "lora" or not every or not counts.experts or not counts.layers:
        return 0.0
    return counts.experts / counts.layers * run.compute_bytes


@dataclass
class Activations:
    tokens: int  # tokens per micro-batch
    per_token: dict[str, float]  # activation_terms(): bytes per token
    layers: int  # layers whose activations are saved
    saved_layers: float  # saved activations of those layers (bytes)
    formula: str  # how ``saved_layers`` is computed
    outside_layers: float  # embeddings, final norm, rotary tables
    outside_in_backward: float  # what of those is left once the head and final norm ran backward
    logits: float  # fp32 logits / loss buffers
    autocast_copies: float  # half copies of fp32 trainable weights under torch.autocast
    dequant: float  # one dequantized weight of a quantized base model
    host: float = 0.0  # use_unsloth_gc: the checkpointed layer inputs, in host memory


def chunked_loss_why_not(run: RunSpec, d: Dims) -> str:
    """Why training builds the full logits of a micro-batch ("" when the chunked loss applies)."""
    return run.chunked_loss_off or model_why_not(d.head_type or d.model_type, d.logits_scaled_by)


def chunk_logit_bytes(run: RunSpec) -> int:
    """Bytes per vocabulary entry and position of the chunked loss's one chunk. A frozen head (the
    gradient made in forward): its fp32 logits, exp'd and made their own gradient in place, and beside
    them the head's half-precision matmul output (before the fp32 copy) or the gradient's half copy
    (before its matmul) under bf16/fp16. A trained head (full fine-tuning): 3 x 4 B, which also covers
    the head's weight gradient made when backward starts (bench/memory_fit.py: within 4 %)."""
    if run.finetuning_type == "full" and run.badam is None:
        return 12
    c = run.compute_bytes
    return 4 + (c if c != 4 else 0)


def chunk_logit_words(run: RunSpec) -> str:
    """What :func:`chunk_logit_bytes` counts, in words."""
    if chunk_logit_bytes(run) == 12:
        return "fp32 logits made their own gradient in place, the head's weight gradient"
    return "fp32 logits made their own gradient in place" + (
        ", a half-precision copy" if run.compute_bytes != 4 else ""
    )


def logit_positions(run: RunSpec, d: Dims, tokens: int) -> int:
    """Positions whose fp32 logits are alive at once: one chunk under the chunked loss, else every one."""
    return min(tokens, CHUNK) if not chunked_loss_why_not(run, d) else tokens


def activations(run: RunSpec, d: Dims, counts: ParamCounts, trainable: int, n_targets: int) -> Activations:
    """Activation memory of one micro-batch, and the transient copies that sit beside it."""
    tokens = run.micro_batch * run.cutoff_len * (2 if run.stage in ("dpo", "rm") else 1)  # pairs: chosen + rejected
    per_token = activation_terms(run, d, n_targets)
    ft, c = run.finetuning_type, run.compute_bytes
    layers = counts.layers
    if ft == "freeze" and run.freeze_trainable_layers > 0 and "embed_tokens" not in run.freeze_extra_modules:
        layers = min(run.freeze_trainable_layers, counts.layers)  # (a trained embedding: backward through all)
    host = 0.0
    if run.gradient_checkpointing:
        saved = layers * per_token["ckpt_layer"] * tokens
        formula = (
            f"{layers} layers x h={d.hidden} x {int(per_token['ckpt_layer'] // d.hidden)} B x {tokens} tokens "
            f"(checkpointing keeps layer inputs)"
        )
        if run.offload_checkpoints:  # in host memory; the one being recomputed is back on the device
            host, saved = saved, per_token["ckpt_layer"] * tokens
            formula = f"1 layer's input on the device, {layers} in host memory (use_unsloth_gc): " + formula
    else:
        saved = layers * per_token["layer"] * tokens
        formula = f"{layers} layers x {per_token['layer']:.0f} B/token x {tokens} tokens"
    merged = merged_experts_bytes(run, d, counts)
    if merged:  # every layer's merged experts, or under checkpointing the one layer being recomputed
        held = 1 if run.gradient_checkpointing else layers
        saved += held * merged
        formula += f" + {held} x {merged / 2**30:.2f} GiB merged LoRA experts (W + BA per MoE layer)"
    autocast = 0.0
    plain = run.zero is None and (run.fsdp is None or run.fsdp.strategy == "no_shard")
    if run.mixed and plain and ft in ("full", "freeze"):
        linear = counts.layers * counts.layer_linear
        autocast = (
            linear * (1 if ft == "full" else trainable / max(counts.total, 1)) + counts.lm_head * (ft == "full")
        ) * c
        if run.badam is not None and run.badam.mode == "layer":  # autocast caches trainable weights only
            autocast = 0.0 if run.bf16 else counts.layer_linear * c
    return Activations(
        tokens=tokens,
        per_token=per_token,
        layers=layers,
        saved_layers=saved,
        formula=formula,
        outside_layers=per_token["nonlayer"] * tokens,
        outside_in_backward=per_token["nonlayer_in_backward"] * tokens,
        logits=4.0 * tokens
        if run.stage == "rm"
        else (
            (chunk_logit_bytes(run) * d.vocab if not chunked_loss_why_not(run, d) else per_token["logits"])
            * logit_positions(run, d, tokens)
        ),
        autocast_copies=autocast,
        dequant=counts.max_linear * c if run.quantization_bit else 0.0,
        host=host,
    )
