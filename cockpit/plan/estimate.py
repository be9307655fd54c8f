"""Per-device peak memory of one training step, as a sum of named terms.

Every term says its formula and where it comes from. Sources:

* ZeRO: Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
  Parameter Models", sec. 3.1: mixed-precision Adam keeps 2 (fp16/bf16 weights) + 2 (fp16/bf16
  grads) + K=12 (fp32 master weights, momentum, variance) bytes per parameter; stage 1 shards the
  12, stage 2 also the gradients, stage 3 also the weights, each over the data-parallel size N.
* Activations: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", sec. 4.1: per layer s*b*h*(34 + 5*a*s/h) bytes for GPT with 16-bit activations,
  counted tensor by tensor. Redone here, same method, for the Llama/Qwen2/Mistral decoder as
  Hugging Face implements it: RMSNorm upcasting to fp32, RoPE, grouped-query attention (k/v have
  kv_heads*head_dim columns unless they are repeated to all heads), SwiGLU MLP (4 tensors of the
  intermediate size: gate, silu(gate), up, silu(gate)*up), no dropout; SDPA/flash attention keeps
  only q, k, v, the output and a logsumexp per head, eager attention also the fp32 softmax
  (a*s per token). Checked tensor by tensor against the live-storage tracker on CPU.
* 4-bit NF4: Dettmers et al. 2023, "QLoRA", sec. 3: 4 bits per weight plus one fp32 absmax per
  64-weight block (0.5 bit/param), or with double quantization an 8-bit absmax per block and one
  fp32 constant per 256 blocks (8/64 + 32/(64*256) = 0.127 bit/param).
* 8-bit Adam: Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization": two 8-bit
  states (1 B each) plus one fp32 absmax per block of 256 (bitsandbytes' blockwise kernels).

Phases: weights, optimizer states and runtime overhead are resident. Gradients and activations
are not at their maxima at the same moment: activations peak at the start of backward (before
any gradient of the step exists unless gradient accumulation keeps last micro-batch's), while
gradients are complete at the end of backward, when only the first layer's activations are
left. The peak is the largest of those moments (and of the optimizer step); the breakdown shown
is the one at the peak moment, so the terms add up to the total.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from cockpit.plan.params import Dims, ParamCounts
from cockpit.plan.spec import ADAM_8, RunSpec

GiB = 1024 ** 3

# Runtime overhead (see README section in the planner report): HIP/CUDA context, loaded kernels,
# rocBLAS/hipBLASLt workspaces; RCCL/NCCL channel buffers with more than one rank; and the caching
# allocator's rounding/fragmentation as a fraction of the tensor peak.
CONTEXT_BYTES = 1.0 * GiB
COLLECTIVE_BYTES = 0.5 * GiB
FRAGMENTATION = 0.05


@dataclass
class Term:
    name: str
    bytes: float
    formula: str
    source: str = ""
    host_bytes: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gib"] = round(self.bytes / GiB, 3)
        return d


@dataclass
class Estimate:
    terms: list[Term]
    moment: str                 # which moment is the peak
    moments: dict[str, float]   # tensor bytes at each moment (without runtime overhead)
    tensor_peak: float          # peak of live tensor bytes (what the CPU bench measures)
    peak: float                 # tensor_peak + runtime overhead: what the device needs
    host_bytes: float           # CPU memory per rank for offloaded states
    params: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    # full size of each quantity, whatever the peak moment: weights, lora, grads, master,
    # optimizer, activations_saved, logits, overhead ... (bytes per device)
    components: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "peak_bytes": int(self.peak), "peak_gib": round(self.peak / GiB, 3),
            "tensor_peak_bytes": int(self.tensor_peak), "moment": self.moment,
            "moments_gib": {k: round(v / GiB, 3) for k, v in self.moments.items()},
            "host_bytes_per_rank": int(self.host_bytes),
            "terms": [t.as_dict() for t in self.terms], "params": self.params, "notes": self.notes,
            "components_bytes": {k: int(v) for k, v in self.components.items()},
        }


def nf4_bytes_per_param(double_quant: bool) -> float:
    # 4 bit weight + quantization constants (QLoRA sec. 3, blocksize 64, second level 256)
    return 0.5 + ((1 / 64 + 4 / (64 * 256)) if double_quant else 4 / 64)


def adam_bytes_per_param(optim: str) -> float:
    # AdamW: exp_avg + exp_avg_sq in fp32 = 8 B. bitsandbytes 8-bit: 2 x 1 B + fp32 absmax per 256.
    return 2 + 2 * 4 / 256 if optim in ADAM_8 else 8.0


def activation_terms(run: RunSpec, d: Dims, n_targets: int) -> dict[str, float]:
    """Activation bytes *per token* (Korthikanti-style accounting adapted to HF Llama)."""
    c = run.compute_bytes
    h, i, qd, kvd, a, s = d.hidden, d.intermediate, d.q_dim, d.kv_dim, d.heads, run.cutoff_len
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
    mask = run.micro_batch > 1 and run.attn != "fa2"   # padded batches carry an attention mask
    if run.attn == "eager":
        kv_eff = qd                      # repeat_kv to all heads
        attn = c * (qd + 2 * kv_eff + qd) + 4 * a * s + (c * a * s if c != 4 else 0) + c * qd
    else:
        kv_eff = qd if (run.attn == "sdpa" and mask) else kvd   # enable_gqa only without a mask
        attn = c * (qd + 2 * kv_eff + qd) + 4 * a   # q, k, v, output (= o_proj input), logsumexp
        if mask and run.attn == "sdpa":
            attn += c * s                # boolean mask turned into an additive float mask, saved
    mlp = 4 * i * c
    lora = n_targets * run.lora_rank * c if run.finetuning_type == "lora" else 0
    layer = 2 * per_norm + autocast_copies + attn + mlp + lora + 2 * 4  # + two rsqrt values
    ckpt_layer = nb * h                   # checkpointing keeps each layer's input only
    lm_head_trains = full
    nonlayer = 4 * h + ((nb * h + nb * h) if lm_head_trains else 0) + 2 * d.head_dim * 4 + 16
    # logits: at the start of backward the fp32 log_softmax (saved), its gradient and the gradient of
    # the logits are alive together: 3 x 4 B x vocab (the forward's logits + fp32 copy are fewer).
    logits = 12 * d.vocab
    # backward of one layer: gradient of the hidden state in and out, MLP-sized gradient buffers
    bwd_transient = c * (2 * h + 3 * i) + (4 * a * s if run.attn == "eager" else 0)
    return {"layer": layer, "ckpt_layer": ckpt_layer, "nonlayer": nonlayer, "logits": logits,
            "bwd_transient": bwd_transient}


def estimate(run: RunSpec, d: Dims, counts: ParamCounts, lora_params: int, n_targets: int) -> Estimate:
    N = run.world
    c = run.compute_bytes
    P = counts.total
    L = counts.layers
    P_lin = L * counts.layer_linear
    ft = run.finetuning_type
    if ft == "full":
        Pt = P
    elif ft == "freeze":
        Pt = min(abs(run.freeze_trainable_layers), L) * counts.per_layer
    else:
        Pt = lora_params
    P_base_frozen = P - (Pt if ft != "lora" else 0)
    zero, fsdp = run.zero, run.fsdp
    plain = zero is None and (fsdp is None or fsdp.strategy == "no_shard")
    shard_n = N
    if fsdp is not None and fsdp.strategy.startswith("hybrid"):
        shard_n = run.nproc_per_node
    notes: list[str] = []
    terms: list[Term] = []
    host = 0.0
    zsrc = "ZeRO paper sec. 3.1 (2+2+12 B/param, sharded by stage)"

    # ---- weights --------------------------------------------------------------------------
    if run.quantization_bit == 4:
        qb = nf4_bytes_per_param(run.double_quantization)
        w_base = P_lin * qb + (P - P_lin) * c
        wf = (f"{P_lin/1e9:.3f}B linear params x {qb:.4f} B (NF4{' + double quant' if run.double_quantization else ''})"
              f" + {(P - P_lin)/1e9:.3f}B embeddings/norms x {c} B")
        wsrc = "QLoRA paper sec. 3 (4-bit NF4, blocksize 64, double quant 256)"
    elif run.quantization_bit == 8:
        qb = 1 + 4 / d.hidden  # int8 weight + one fp32 scale per output row (LLM.int8)
        w_base = P_lin * qb + (P - P_lin) * c
        wf = f"{P_lin/1e9:.3f}B linear params x ~1 B (int8 + per-row scale) + {(P - P_lin)/1e9:.3f}B x {c} B"
        wsrc = "LLM.int8 (Dettmers et al. 2022): int8 weights, fp32 scale per row"
    else:
        w_base = None
        wsrc = ""
    if zero is not None and run.mixed:
        # DeepSpeed casts the module to bf16/fp16; fp32 copies live in the optimizer (master)
        w = w_base if w_base is not None else P * c
        wf = wf if w_base is not None else f"{P/1e9:.3f}B params x {c} B ({run.precision})"
        wsrc = wsrc or zsrc
    elif w_base is not None:
        w = w_base
    else:
        # LLaMA-Factory upcasts trainable params to fp32; frozen ones stay in the load dtype
        w = P_base_frozen * c + (Pt if ft != "lora" else 0) * 4
        if ft == "lora":
            wf = f"{P/1e9:.3f}B frozen base params x {c} B ({run.precision})"
        elif ft == "full":
            wf = f"{P/1e9:.3f}B params x 4 B (fp32" + (", upcast for training)" if run.mixed else ")")
        else:
            wf = f"{P_base_frozen/1e9:.3f}B frozen x {c} B + {Pt/1e9:.3f}B trainable x 4 B"
        wsrc = "trainable params upcast to fp32 (LLaMA-Factory), frozen in the load dtype"
    w_div = 1
    if zero is not None and zero.stage == 3:
        w_div = N
    elif fsdp is not None and fsdp.strategy in ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2"):
        w_div = shard_n
    w_dev = w / w_div
    if (zero is not None and zero.offload_param) or (fsdp is not None and fsdp.offload):
        host += w_dev
        terms.append(Term("weights", 0.0, wf + f", /{w_div} sharded, offloaded to CPU", wsrc, host_bytes=w_dev))
    else:
        terms.append(Term("weights", w_dev, wf + (f", / {w_div} (sharded)" if w_div > 1 else ""), wsrc))

    # LoRA adapter weights (fp32, upcast by LLaMA-Factory; bf16 inside a DeepSpeed module)
    if ft == "lora":
        lb = c if (zero is not None and run.mixed) else 4
        terms.append(Term("lora weights", Pt * lb / w_div,
                          f"{Pt/1e6:.2f}M LoRA params (r={run.lora_rank}, {n_targets} modules/layer) x {lb} B",
                          "PEFT get_peft_model on the meta model"))

    # ---- preference stages: the reference model (frozen, forward only) ------------------------
    if run.reference_copy:
        terms.append(Term("reference model", P * c / w_div, f"{P/1e9:.3f}B frozen params x {c} B (a second copy of the base)",
                          "DPO / KTO reference: ref_model, or a copy of the base when the policy is not LoRA"))
    elif run.stage in ("dpo", "kto") and ft == "lora":
        notes.append("reference model: the base with the LoRA adapter disabled (no second copy in memory)")

    # ---- gradients, master weights, optimizer states --------------------------------------
    adam_b = adam_bytes_per_param(run.optim)
    if zero is not None:
        gb = c if run.mixed else 4
        g_div = N if zero.stage >= 2 else 1
        s_div = N if zero.stage >= 1 else 1
        grads = Pt * gb / g_div
        gf = f"{Pt/1e9:.3f}B trainable x {gb} B" + (f" / {N}" if g_div > 1 else "")
        master = Pt * 4 / s_div if run.mixed else 0.0
        opt = Pt * adam_b / s_div
        if zero.offload_optimizer:
            host += master + opt + Pt * 4 / s_div  # fp32 grads for the CPU optimizer
            terms.append(Term("master weights (fp32)", 0.0, "offloaded to CPU", zsrc, host_bytes=master))
            terms.append(Term("optimizer states", 0.0, "offloaded to CPU", zsrc, host_bytes=opt))
        else:
            if run.mixed:
                terms.append(Term("master weights (fp32)", master, f"{Pt/1e9:.3f}B x 4 B" + (f" / {N}" if s_div > 1 else ""), zsrc))
            terms.append(Term("optimizer states", opt, f"{Pt/1e9:.3f}B x {adam_b:g} B (AdamW m, v)" + (f" / {N}" if s_div > 1 else ""), zsrc))
    elif fsdp is not None and fsdp.strategy != "no_shard":
        grads = Pt * 4 / shard_n
        gf = f"{Pt/1e9:.3f}B trainable x 4 B / {shard_n}"
        opt = Pt * adam_b / shard_n
        if fsdp.offload:
            host += opt + grads
            terms.append(Term("optimizer states", 0.0, "offloaded to CPU (FSDP cpu offload)", "", host_bytes=opt))
            gf += ", offloaded to CPU"
            grads_dev = 0.0
        else:
            terms.append(Term("optimizer states", opt, f"{Pt/1e9:.3f}B x {adam_b:g} B / {shard_n} (FSDP shards like ZeRO-3)", zsrc))
            grads_dev = grads
        grads = grads_dev
    else:
        grads = Pt * 4
        gf = f"{Pt/1e9:.3f}B trainable x 4 B (fp32)"
        terms.append(Term("optimizer states", Pt * adam_b, f"{Pt/1e9:.3f}B trainable x {adam_b:g} B (AdamW m, v in fp32)"
                          if adam_b == 8 else f"{Pt/1e9:.3f}B trainable x {adam_b:g} B (8-bit AdamW)",
                          "ZeRO paper sec. 3.1 (Adam: K=8 for m and v; master weights are the fp32 params)"
                          if adam_b == 8 else "8-bit optimizers paper (block-wise, blocksize 256)"))

    # ---- communication / gathered params ---------------------------------------------------
    resident_extra: list[Term] = []
    gathered = 0.0
    if zero is not None:
        reduce_b = zero.reduce_bucket if zero.reduce_bucket is not None else d.hidden ** 2
        bb = c if run.mixed else 4
        if zero.stage == 3:
            gathered = counts.per_layer * bb
            resident_extra.append(Term("gathered params (ZeRO-3)", gathered,
                                       f"one decoder layer ({counts.per_layer/1e6:.0f}M) x {bb} B fetched at a time",
                                       "DeepSpeed stage 3 fetches per submodule with a prefetch bucket"))
            resident_extra.append(Term("ZeRO buckets", reduce_b * bb, f"reduce_bucket_size {reduce_b:.3g} x {bb} B",
                                       "DeepSpeed zero_optimization"))
        elif N > 1 or zero.stage > 0:
            ag = zero.allgather_bucket if zero.allgather_bucket is not None else 5e8
            buck = (reduce_b + (ag if zero.stage in (1, 2) else 0)) * bb
            resident_extra.append(Term("ZeRO buckets", buck, f"(reduce {reduce_b:.3g} + allgather {ag if zero.stage in (1, 2) else 0:.3g}) x {bb} B",
                                       "DeepSpeed zero_optimization bucket sizes"))
    elif fsdp is not None and fsdp.strategy != "no_shard":
        if fsdp.strategy in ("shard_grad_op", "hybrid_shard_zero2"):
            gathered = P * c
            gtxt = f"all params unsharded in {c} B during forward/backward (SHARD_GRAD_OP)"
        else:
            gathered = 2 * counts.per_layer * c
            gtxt = f"2 units (current + prefetch) x one layer {counts.per_layer/1e6:.0f}M x {c} B"
        resident_extra.append(Term("gathered params (FSDP)", gathered, gtxt, "FSDP unit = decoder layer (auto_wrap)"))
    elif N > 1:
        resident_extra.append(Term("DDP gradient buckets", Pt * 4, f"{Pt/1e9:.3f}B x 4 B (flat bucket copy of grads)",
                                   "torch DDP reducer (gradient_as_bucket_view=False)"))

    # ---- activations -----------------------------------------------------------------------
    T = run.micro_batch * run.cutoff_len * (2 if run.stage in ("dpo", "rm") else 1)  # pairs: chosen + rejected
    act = activation_terms(run, d, n_targets)
    act_layers = L
    if ft == "freeze" and run.freeze_trainable_layers > 0:
        act_layers = min(run.freeze_trainable_layers, L)
    if run.gradient_checkpointing:
        a_layers = act_layers * act["ckpt_layer"] * T
        af = (f"{act_layers} layers x h={d.hidden} x {int(act['ckpt_layer'] // d.hidden)} B x {T} tokens "
              f"(checkpointing keeps layer inputs)")
    else:
        a_layers = act_layers * act["layer"] * T
        af = f"{act_layers} layers x {act['layer']:.0f} B/token x {T} tokens"
    a_non = act["nonlayer"] * T
    asrc = f"Korthikanti et al. 2022 sec. 4.1, adapted: SwiGLU, GQA, RMSNorm, {run.attn} attention"
    logits_b = act["logits"] * T if run.stage != "rm" else 4.0 * T  # rm: one value-head score per token
    autocast_w = 0.0
    if run.mixed and plain and ft in ("full", "freeze"):
        autocast_w = (P_lin * (1 if ft == "full" else Pt / max(P, 1)) + counts.lm_head * (ft == "full")) * c
    dequant = counts.max_linear * c if run.quantization_bit else 0.0

    # moments -------------------------------------------------------------------------------
    resident = sum(t.bytes for t in terms) + sum(t.bytes for t in resident_extra)
    g_in_act = grads if run.grad_accum > 1 else 0.0
    one_layer = act["layer"] * T + act["bwd_transient"] * T
    # start of backward: every saved activation, the loss buffers, no gradient of this step yet
    m_act = resident + a_layers + a_non + logits_b + g_in_act + autocast_w + dequant
    moments = {"activations (start of backward)": m_act}
    if run.gradient_checkpointing:
        # the last layer is recomputed: its full activations on top of the saved layer inputs;
        # the loss buffers are gone, lm_head/norm gradients exist
        g_head = (counts.lm_head + counts.other + (counts.embedding if d.tied else 0)) * (grads / max(Pt, 1)) \
            if ft == "full" else 0.0
        moments["recompute (first layer of backward)"] = resident + a_layers + a_non + one_layer + \
            max(g_in_act, g_head) + autocast_w + dequant
    # end of backward: all gradients, the first layer's activations and backward buffers
    # tied embeddings: the embedding's gradient arrives last and is added to lm_head's, which
    # allocates the incoming dense V x h gradient and the sum next to the stored one
    tied_extra = 2 * counts.embedding * (grads / max(Pt, 1)) if (ft == "full" and d.tied) else 0.0
    moments["gradients (end of backward)"] = resident + grads + one_layer + tied_extra + dequant
    step_tmp = 4 * Pt / (N if (zero and zero.stage >= 1) or (fsdp and fsdp.strategy != "no_shard") else 1) \
        if run.optim in ("adamw_torch", "adamw_hf") else 0.0
    moments["optimizer step"] = resident + grads + step_tmp
    moment = max(moments, key=moments.get)
    tensor_peak = moments[moment]

    out = list(terms) + resident_extra
    if moment.startswith("activations"):
        out.append(Term("gradients", g_in_act, gf + (" (kept across accumulation)" if g_in_act else
                        ": none yet at this moment (the step's gradients appear during backward)"), zsrc))
        out.append(Term("activations", a_layers + a_non, af + f" + outside layers {act['nonlayer']:.0f} B/token", asrc))
        out.append(Term("logits / loss", logits_b, f"3 x 4 B x vocab {d.vocab} x {T} tokens (fp32 log_softmax, its grad, grad of logits)",
                        "HF ForCausalLMLoss upcasts logits to fp32") if run.stage != "rm" else
                   Term("value head scores", logits_b, f"4 B x {T} tokens (one fp32 score per token, no vocabulary logits)", "reward model (rm)"))
        if autocast_w:
            out.append(Term("autocast weight copies", autocast_w, f"trainable linear weights x {c} B (autocast cache, saved for backward)",
                            "torch.autocast casts fp32 weights once per forward"))
    elif moment.startswith("recompute"):
        gg = moments[moment] - (resident + a_layers + a_non + one_layer + autocast_w + dequant)
        out.append(Term("gradients", gg, gf + (" (kept across accumulation)" if g_in_act else
                        ": only lm_head/final-norm gradients so far"), zsrc))
        out.append(Term("activations", a_layers + a_non + one_layer,
                        af + f" + the layer being recomputed and its backward buffers, {T} tokens", asrc))
        if autocast_w:
            out.append(Term("autocast weight copies", autocast_w, f"trainable linear weights x {c} B",
                            "torch.autocast casts fp32 weights once per forward"))
    elif moment.startswith("gradients"):
        out.append(Term("gradients", grads, gf, zsrc))
        out.append(Term("activations", one_layer, f"first layer's activations + backward buffers, {T} tokens", asrc))
        if tied_extra:
            out.append(Term("tied embedding gradient", tied_extra, f"2 x vocab x hidden x {grads / max(Pt, 1):g} B",
                            "autograd accumulates the embedding's and lm_head's gradients"))
    else:
        out.append(Term("gradients", grads, gf, zsrc))
        if step_tmp:
            out.append(Term("optimizer step buffers", step_tmp, "foreach AdamW: one fp32 temporary per trainable param",
                            "torch.optim.AdamW(foreach=True)"))
    if dequant and not moment.startswith("optimizer"):
        out.append(Term("dequantize buffer", dequant, f"largest linear {counts.max_linear/1e6:.0f}M x {c} B",
                        "bitsandbytes dequantizes one weight at a time"))
    overhead = CONTEXT_BYTES + (COLLECTIVE_BYTES if N > 1 else 0) + FRAGMENTATION * tensor_peak
    out.append(Term("runtime overhead", overhead,
                    f"{CONTEXT_BYTES/GiB:.1f} GiB context/kernels/BLAS workspaces"
                    + (f" + {COLLECTIVE_BYTES/GiB:.1f} GiB RCCL buffers" if N > 1 else "")
                    + f" + {FRAGMENTATION:.0%} of tensor peak (allocator fragmentation)",
                    "rule of thumb, see planner notes"))
    if run.micro_batch > 1 and run.attn == "sdpa":
        notes.append("micro-batch > 1: padded batches carry a mask, so SDPA repeats k/v to all heads and keeps a float mask per layer")
    if run.cutoff_len > 8192 and run.attn == "eager":
        notes.append("eager attention at long cutoff: the a*s^2 softmax dominates; use sdpa or fa2")
    params = {"total": P, "trainable": Pt, "lora": lora_params if ft == "lora" else 0, "layers": L,
              "source": counts.source, "data_parallel": N, "tokens_per_micro_batch": T}
    by_name = {t.name: t.bytes for t in terms + resident_extra}
    components = {
        "weights": by_name.get("weights", 0.0), "lora": by_name.get("lora weights", 0.0),
        "grads": grads, "master": by_name.get("master weights (fp32)", 0.0),
        "optimizer": by_name.get("optimizer states", 0.0),
        "comm": sum(t.bytes for t in resident_extra),
        "activations_saved": a_layers + a_non, "activations_per_layer_per_token": act["layer"],
        "logits": logits_b, "autocast_copies": autocast_w, "dequant": dequant, "overhead": overhead,
    }
    return Estimate(terms=out, moment=moment, moments=moments, tensor_peak=tensor_peak,
                    peak=tensor_peak + overhead, host_bytes=host, params=params, notes=notes,
                    components=components)
