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

from cockpit.models.lm_head import CHUNK
from cockpit.plan.activations import (
    Activations,
    activations,
    chunk_logit_bytes,
    chunk_logit_words,
    chunked_loss_why_not,
    merged_experts_bytes,
    router_bytes,
)
from cockpit.plan.optim_states import StateModel, badam_active, badam_states, low_rank_states
from cockpit.plan.params import Dims, ParamCounts
from cockpit.plan.spec import ADAM_8, RunSpec

GiB = 1024**3

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
    moment: str  # which moment is the peak
    moments: dict[str, float]  # tensor bytes at each moment (without runtime overhead)
    tensor_peak: float  # peak of live tensor bytes (what the CPU bench measures)
    peak: float  # tensor_peak + runtime overhead: what the device needs
    host_bytes: float  # CPU memory per rank for offloaded states
    params: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    # full size of each quantity, whatever the peak moment: weights, lora, grads, master,
    # optimizer, activations_saved, logits, overhead ... (bytes per device)
    components: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "peak_bytes": int(self.peak),
            "peak_gib": round(self.peak / GiB, 3),
            "tensor_peak_bytes": int(self.tensor_peak),
            "moment": self.moment,
            "moments_gib": {k: round(v / GiB, 3) for k, v in self.moments.items()},
            "host_bytes_per_rank": int(self.host_bytes),
            "terms": [t.as_dict() for t in self.terms],
            "params": self.params,
            "notes": self.notes,
            "components_bytes": {k: int(v) for k, v in self.components.items()},
        }


def nf4_bytes_per_param(double_quant: bool) -> float:
    # 4 bit weight + quantization constants (QLoRA sec. 3, blocksize 64, second level 256)
    return 0.5 + ((1 / 64 + 4 / (64 * 256)) if double_quant else 4 / 64)


def adam_bytes_per_param(optim: str) -> float:
    # AdamW: exp_avg + exp_avg_sq in fp32 = 8 B. bitsandbytes 8-bit: 2 x 1 B + fp32 absmax per 256.
    return 2 + 2 * 4 / 256 if optim in ADAM_8 else 8.0


ZERO_SOURCE = "ZeRO paper sec. 3.1 (2+2+12 B/param, sharded by stage)"
ACTIVATION_SOURCE = "Korthikanti et al. 2022 sec. 4.1, adapted: SwiGLU, GQA, RMSNorm, {attn} attention"
AUTOCAST_SOURCE = "torch.autocast casts fp32 weights once per forward"


def estimate(run: RunSpec, d: Dims, counts: ParamCounts, lora_params: int, n_targets: int) -> Estimate:
    """Per-device peak of one training step: the resident terms (weights, optimizer states,
    communication buffers), the moment of the step that peaks, its breakdown, and the runtime overhead."""
    trainable, frozen = trainable_params(run, counts, lora_params)
    weight_terms, weights_host, weight_shards = weights(run, d, counts, trainable, frozen, n_targets)
    states = optimizer_states(run, d, counts, trainable)
    comm = communication_terms(run, d, counts, trainable)
    acts = activations(run, d, counts, trainable, n_targets)
    resident = sum(t.bytes for t in weight_terms + states.terms) + sum(t.bytes for t in comm)
    step = _StepMemory(
        trainable=trainable,
        resident=resident,
        grads=states.grads,
        kept_grads=states.grads if run.grad_accum > 1 else 0.0,
        one_layer=acts.per_token["layer"] * acts.tokens + acts.per_token["bwd_transient"] * acts.tokens,
        tied_extra=tied_embedding_gradient(run, d, counts, trainable, states.grads),
        step_buffers=optimizer_step_buffers(run, badam_active(run, counts) if run.badam else trainable),
    )
    moments = step_moments(run, d, counts, acts, step)
    moment = max(moments, key=moments.__getitem__)
    tensor_peak = moments[moment]

    out = weight_terms + states.terms + comm + peak_terms(moment, moments, run, d, counts, acts, step, states.formula)
    overhead = CONTEXT_BYTES + (COLLECTIVE_BYTES if run.world > 1 else 0) + FRAGMENTATION * tensor_peak
    out.append(overhead_term(run, overhead))
    params = {
        "total": counts.total,
        "trainable": trainable,
        "lora": lora_params if run.finetuning_type == "lora" else 0,
        "layers": counts.layers,
        "source": counts.source,
        "data_parallel": run.world,
        "tokens_per_micro_batch": acts.tokens,
    }
    by_name = {t.name: t.bytes for t in weight_terms + states.terms + comm}
    if counts.experts:  # a mixture-of-experts model: what its experts and routers take
        params["experts"] = experts_summary(run, d, counts, acts, by_name.get("weights", 0.0))
    components = {
        "weights": by_name.get("weights", 0.0),
        "lora": by_name.get("lora weights", 0.0),
        "grads": states.grads,
        "master": by_name.get("master weights (fp32)", 0.0),
        "optimizer": by_name.get("optimizer states", 0.0),
        "optimizer_adamw": states.adamw
        or by_name.get(
            "optimizer states", 0.0
        ),  # what AdamW's moments would take (GaLore / APOLLO / BAdam save the rest)
        "comm": sum(t.bytes for t in comm),
        "activations_saved": acts.saved_layers + acts.outside_layers,
        "activations_per_layer_per_token": acts.per_token["layer"],
        "logits": acts.logits,
        "autocast_copies": acts.autocast_copies,
        "dequant": acts.dequant,
        "overhead": overhead,
    }
    return Estimate(
        terms=out,
        moment=moment,
        moments=moments,
        tensor_peak=tensor_peak,
        peak=tensor_peak + overhead,
        host_bytes=weights_host + states.host + acts.host,
        params=params,
        notes=planner_notes(run) + vlm_notes(run, counts),
        components=components,
    )


def experts_summary(run: RunSpec, d: Dims, counts: ParamCounts, acts: Activations, weights: float) -> dict[str, Any]:
    """An MoE model's lines of the plan: total and active parameters, the expert weights' share of the
    weights per device, the router logits and the routed experts' activations of one micro-batch
    (every layer's, or one layer's under gradient checkpointing), LoRA's merged expert copies."""
    held = 1 if run.gradient_checkpointing else acts.layers
    routed = d.top_k * (4 * d.expert_intermediate + 2 * d.hidden) * run.compute_bytes
    return {
        "routed": d.experts,
        "top_k": d.top_k,
        "shared": d.shared_experts,
        "total_params": counts.total,
        "active_params": counts.active,
        "expert_params": counts.experts,
        "expert_weights_bytes": weights * counts.experts / max(counts.total, 1),
        "router_logits_bytes": router_bytes(run, d) * counts.layers * acts.tokens,
        "router_logits_kept": run.router_logits_kept,
        "routed_activations_bytes": routed * held * acts.tokens,
        "merged_lora_experts_bytes": merged_experts_bytes(run, d, counts) * held,
    }


def trainable_params(run: RunSpec, counts: ParamCounts, lora_params: int) -> tuple[int, int]:
    """(trainable parameters, frozen base parameters)."""
    ft = run.finetuning_type
    if ft == "full":
        trainable = counts.total - vlm_frozen_params(run, counts)
    elif ft == "freeze":
        trainable = min(abs(run.freeze_trainable_layers), counts.layers) * counts.per_layer
        extra = {"embed_tokens": counts.embedding, "lm_head": counts.lm_head}
        trainable += sum(extra.get(m, 0) for m in run.freeze_extra_modules)  # the final norm: a rounding error
    else:
        trainable = lora_params
    return trainable, counts.total - (trainable if ft != "lora" else 0)


def shard_group(run: RunSpec) -> int:
    """How many devices FSDP shards over: all of them, or one node's with a hybrid strategy."""
    fsdp = run.fsdp
    return run.nproc_per_node if fsdp is not None and fsdp.strategy.startswith("hybrid") else run.world


def quantized_base_weights(run: RunSpec, d: Dims, counts: ParamCounts) -> tuple[float | None, str, str]:
    """(bytes, formula, source) of a 4-/8-bit quantized base model; (None, "", "") when not quantized.
    What bitsandbytes does not quantize (embeddings, lm_head, norms) keeps the run's dtype
    (``cockpit.train.model.prepare_quantized_base``, LLaMA-Factory's way). A vision-language model's tower and
    projector linears are quantized too: LLaMA-Factory 0.9.5 passes no ``llm_int8_skip_modules``, and
    transformers then keeps only the LM head (tied / output embeddings) unquantized."""
    total = counts.total
    linear = counts.layers * counts.layer_linear + counts.vision_linear
    kept = run.compute_bytes
    rest = f" + {(total - linear) / 1e9:.3f}B embeddings/norms x {kept} B (not quantized, the run's dtype)"
    if counts.vision_linear:
        rest += f"; the linears include the vision tower's and projector's {counts.vision_linear / 1e6:.2f}M"
    if run.quantization_bit == 4:
        per_param = nf4_bytes_per_param(run.double_quantization)
        formula = (
            f"{linear / 1e9:.3f}B linear params x {per_param:.4f} B (NF4{' + double quant' if run.double_quantization else ''})"
            + rest
        )
        return (
            linear * per_param + (total - linear) * kept,
            formula,
            "QLoRA paper sec. 3 (4-bit NF4, blocksize 64, double quant 256)",
        )
    if run.quantization_bit == 8:
        per_param = 1 + 4 / d.hidden  # int8 weight + one fp32 scale per output row (LLM.int8)
        formula = f"{linear / 1e9:.3f}B linear params x ~1 B (int8 + per-row scale)" + rest
        return (
            linear * per_param + (total - linear) * kept,
            formula,
            "LLM.int8 (Dettmers et al. 2022): int8 weights, fp32 scale per row",
        )
    return None, "", ""


def weight_shards(run: RunSpec) -> int:
    """Over how many devices the weights are sharded (ZeRO-3, or FSDP's sharding strategies)."""
    if run.zero is not None and run.zero.stage == 3:
        return run.world
    if run.fsdp is not None and run.fsdp.strategy in (
        "full_shard",
        "shard_grad_op",
        "hybrid_shard",
        "hybrid_shard_zero2",
    ):
        return shard_group(run)
    return 1


def vlm_frozen_params(run: RunSpec, counts: ParamCounts) -> int:
    """A vision-language model's parameters that full fine-tuning leaves frozen (its freeze keys)."""
    if not (counts.vision or counts.projector):
        return 0
    language = counts.total - counts.vision - counts.projector
    sizes = {"vision": counts.vision, "projector": counts.projector, "language": language}
    return sum(sizes[part] for part in run.vlm_frozen)


def weights(
    run: RunSpec, d: Dims, counts: ParamCounts, trainable: int, frozen: int, n_targets: int
) -> tuple[list[Term], float, int]:
    """The weights term (and the LoRA adapter's), the host bytes when offloaded, the shard count."""
    c, total, ft, zero, fsdp = run.compute_bytes, counts.total, run.finetuning_type, run.zero, run.fsdp
    quantized, formula, source = quantized_base_weights(run, d, counts)
    if zero is not None and run.mixed:
        # DeepSpeed casts the module to bf16/fp16; fp32 copies live in the optimizer (master)
        size = quantized if quantized is not None else total * c
        formula = formula if quantized is not None else f"{total / 1e9:.3f}B params x {c} B ({run.precision})"
        source = source or ZERO_SOURCE
    elif quantized is not None:
        size = quantized
    elif run.badam is not None and run.badam.mode == "layer" and run.bf16:
        size = total * c  # the active layer's fp32 copy is the "master weights" term
        formula = f"{total / 1e9:.3f}B params x {c} B (bf16: BAdam's layer mode updates an fp32 copy of one layer)"
        source = "LLaMA-Factory / Cockpit load BAdam's layer mode in bf16"
    else:
        # LLaMA-Factory upcasts trainable params to fp32; frozen ones stay in the load dtype
        size = frozen * c + (trainable if ft != "lora" else 0) * 4
        if ft == "lora":
            formula = f"{total / 1e9:.3f}B frozen base params x {c} B ({run.precision})"
        elif ft == "full" and not frozen:
            formula = f"{total / 1e9:.3f}B params x 4 B (fp32" + (", upcast for training)" if run.mixed else ")")
        else:
            formula = f"{frozen / 1e9:.3f}B frozen x {c} B + {trainable / 1e9:.3f}B trainable x 4 B"
        source = "trainable params upcast to fp32 (LLaMA-Factory), frozen in the load dtype"
    shards = weight_shards(run)
    host_table = embedding_in_host_memory(run, d, counts)
    if host_table:
        size -= host_table
        formula += f", of which the input embedding ({counts.embedding / 1e6:.1f}M params) in host memory"
    per_device = size / shards
    host = host_table
    if (zero is not None and zero.offload_param) or (fsdp is not None and fsdp.offload):
        host += per_device
        terms = [
            Term("weights", 0.0, formula + f", /{shards} sharded, offloaded to CPU", source, host_bytes=per_device)
        ]
    else:
        terms = [
            Term(
                "weights",
                per_device,
                formula + (f", / {shards} (sharded)" if shards > 1 else ""),
                source,
                host_bytes=host_table,
            )
        ]
    if ft == "lora":
        # LoRA adapter weights (fp32, upcast by LLaMA-Factory; bf16 inside a DeepSpeed module)
        adapter_bytes = c if (zero is not None and run.mixed) else 4
        terms.append(
            Term(
                "lora weights",
                trainable * adapter_bytes / shards,
                f"{trainable / 1e6:.2f}M LoRA params (r={run.lora_rank}, {n_targets} modules/layer) x {adapter_bytes} B",
                "PEFT get_peft_model on the meta model",
            )
        )
    if run.reference_copy:  # dpo / kto: a frozen second copy of the base (ref_model, or no LoRA to disable)
        terms.append(
            Term(
                "reference model",
                total * c / shards,
                f"{total / 1e9:.3f}B frozen params x {c} B (a second copy of the base)",
                "DPO / KTO reference: ref_model, or a copy of the base when the policy is not LoRA",
            )
        )
    return terms, host, shards


def embedding_in_host_memory(run: RunSpec, d: Dims, counts: ParamCounts) -> float:
    """Bytes of the input embedding a LoRA run keeps in host memory (cockpit.train.host_embedding;
    the rule: cockpit.models.embedding_place), 0 when it stays on the device (tied to the LM head)."""
    return counts.embedding * run.compute_bytes if (run.embedding_on_host and not d.tied) else 0.0


@dataclass
class OptimizerStates:
    terms: list[Term]  # master weights, optimizer states (resident)
    grads: float  # gradient bytes on the device once backward is complete
    formula: str  # how ``grads`` is computed, for the gradients term
    host: float  # CPU bytes for offloaded states
    adamw: float = 0.0  # what AdamW's moments over the trainable parameters would take


def optimizer_states(run: RunSpec, d: Dims, counts: ParamCounts, trainable: int) -> OptimizerStates:
    """Gradients, fp32 master weights and AdamW states per device, by how ZeRO / FSDP shard them;
    GaLore / APOLLO / BAdam's smaller states on one device (:mod:`cockpit.plan.optim_states`)."""
    world, c, zero, fsdp = run.world, run.compute_bytes, run.zero, run.fsdp
    adam = adam_bytes_per_param(run.optim)
    if zero is None and (fsdp is None or fsdp.strategy == "no_shard"):
        if run.badam is not None and run.finetuning_type == "full":
            return _low_memory_terms(badam_states(run, counts, adam))
        if run.low_rank is not None and run.finetuning_type != "lora":
            return _low_memory_terms(low_rank_states(run, d, counts, trainable, adam))
    billions = f"{trainable / 1e9:.3f}B"
    terms: list[Term] = []
    if zero is not None:
        grad_bytes = c if run.mixed else 4
        grad_div = world if zero.stage >= 2 else 1
        state_div = world if zero.stage >= 1 else 1
        grads = trainable * grad_bytes / grad_div
        formula = f"{billions} trainable x {grad_bytes} B" + (f" / {world}" if grad_div > 1 else "")
        master = trainable * 4 / state_div if run.mixed else 0.0
        opt = trainable * adam / state_div
        if zero.offload_optimizer:
            host = master + opt + trainable * 4 / state_div  # fp32 grads for the CPU optimizer
            terms.append(Term("master weights (fp32)", 0.0, "offloaded to CPU", ZERO_SOURCE, host_bytes=master))
            terms.append(Term("optimizer states", 0.0, "offloaded to CPU", ZERO_SOURCE, host_bytes=opt))
            return OptimizerStates(terms, grads, formula, host)
        sharded = f" / {world}" if state_div > 1 else ""
        if run.mixed:
            terms.append(Term("master weights (fp32)", master, f"{billions} x 4 B" + sharded, ZERO_SOURCE))
        terms.append(Term("optimizer states", opt, f"{billions} x {adam:g} B (AdamW m, v)" + sharded, ZERO_SOURCE))
        return OptimizerStates(terms, grads, formula, 0.0)
    if fsdp is not None and fsdp.strategy != "no_shard":
        group = shard_group(run)
        grads = trainable * 4 / group
        formula = f"{billions} trainable x 4 B / {group}"
        opt = trainable * adam / group
        if fsdp.offload:
            terms.append(Term("optimizer states", 0.0, "offloaded to CPU (FSDP cpu offload)", "", host_bytes=opt))
            return OptimizerStates(terms, 0.0, formula + ", offloaded to CPU", opt + grads)
        terms.append(
            Term("optimizer states", opt, f"{billions} x {adam:g} B / {group} (FSDP shards like ZeRO-3)", ZERO_SOURCE)
        )
        return OptimizerStates(terms, grads, formula, 0.0)
    terms.append(
        Term(
            "optimizer states",
            trainable * adam,
            f"{billions} trainable x {adam:g} B (AdamW m, v in fp32)"
            if adam == 8
            else f"{billions} trainable x {adam:g} B (8-bit AdamW)",
            "ZeRO paper sec. 3.1 (Adam: K=8 for m and v; master weights are the fp32 params)"
            if adam == 8
            else "8-bit optimizers paper (block-wise, blocksize 256)",
        )
    )
    return OptimizerStates(terms, trainable * 4, f"{billions} trainable x 4 B (fp32)", 0.0)


def _low_memory_terms(model: StateModel) -> OptimizerStates:
    """The resident terms of an optimizer that keeps less than AdamW (its formula says how much less)."""
    terms = []
    if model.master:
        terms.append(Term("master weights (fp32)", model.master, model.master_formula, model.source))
    terms.append(Term("optimizer states", model.optimizer, model.optimizer_formula, model.source))
    return OptimizerStates(terms, model.grads, model.grads_formula, 0.0, adamw=model.adamw)


def communication_terms(run: RunSpec, d: Dims, counts: ParamCounts, trainable: int) -> list[Term]:
    """Resident communication memory: ZeRO buckets and gathered params, FSDP's unsharded units,
    DDP's gradient buckets."""
    zero, fsdp, c = run.zero, run.fsdp, run.compute_bytes
    if zero is not None:
        reduce_elems = zero.reduce_bucket if zero.reduce_bucket is not None else d.hidden**2
        bucket_bytes = c if run.mixed else 4
        if zero.stage == 3:
            return [
                Term(
                    "gathered params (ZeRO-3)",
                    counts.per_layer * bucket_bytes,
                    f"one decoder layer ({counts.per_layer / 1e6:.0f}M) x {bucket_bytes} B fetched at a time",
                    "DeepSpeed stage 3 fetches per submodule with a prefetch bucket",
                ),
                Term(
                    "ZeRO buckets",
                    reduce_elems * bucket_bytes,
                    f"reduce_bucket_size {reduce_elems:.3g} x {bucket_bytes} B",
                    "DeepSpeed zero_optimization",
                ),
            ]
        if run.world > 1 or zero.stage > 0:
            allgather = zero.allgather_bucket if zero.allgather_bucket is not None else 5e8
            allgather_used = allgather if zero.stage in (1, 2) else 0
            return [
                Term(
                    "ZeRO buckets",
                    (reduce_elems + allgather_used) * bucket_bytes,
                    f"(reduce {reduce_elems:.3g} + allgather {allgather_used:.3g}) x {bucket_bytes} B",
                    "DeepSpeed zero_optimization bucket sizes",
                )
            ]
        return []
    if fsdp is not None and fsdp.strategy != "no_shard":
        if fsdp.strategy in ("shard_grad_op", "hybrid_shard_zero2"):
            gathered = counts.total * c
            text = f"all params unsharded in {c} B during forward/backward (SHARD_GRAD_OP)"
        else:
            gathered = 2 * counts.per_layer * c
            text = f"2 units (current + prefetch) x one layer {counts.per_layer / 1e6:.0f}M x {c} B"
        return [Term("gathered params (FSDP)", gathered, text, "FSDP unit = decoder layer (auto_wrap)")]
    if run.world > 1:
        return [
            Term(
                "DDP gradient buckets",
                trainable * 4,
                f"{trainable / 1e9:.3f}B x 4 B (flat bucket copy of grads)",
                "torch DDP reducer (gradient_as_bucket_view=False)",
            )
        ]
    return []


@dataclass
class _StepMemory:
    trainable: int  # trainable parameters
    resident: float  # weights, optimizer states, communication buffers
    grads: float  # all gradients of the step (end of backward)
    kept_grads: float  # gradients alive before backward: accumulated from the last micro-batch
    one_layer: float  # one layer's activations and backward buffers
    tied_extra: float  # tied embeddings: the second dense gradient while the two are summed
    step_buffers: float  # the optimizer step's temporaries


def tied_embedding_gradient(run: RunSpec, d: Dims, counts: ParamCounts, trainable: int, grads: float) -> float:
    # tied embeddings: the embedding's gradient arrives last and is added to lm_head's, which
    # allocates the incoming dense V x h gradient and the sum next to the stored one
    full = run.finetuning_type == "full" and run.badam is None  # BAdam freezes the embeddings
    return 2 * counts.embedding * (grads / max(trainable, 1)) if (full and d.tied) else 0.0


def optimizer_step_buffers(run: RunSpec, trainable: int) -> float:
    """foreach AdamW: one fp32 temporary per trainable parameter (sharded like the states)."""
    zero, fsdp = run.zero, run.fsdp
    if run.low_rank is not None or (run.badam is not None and run.badam.mode == "ratio"):
        return 0.0  # their own per-parameter loops, not foreach over all
    sharded = (zero and zero.stage >= 1) or (fsdp and fsdp.strategy != "no_shard")
    return 4 * trainable / (run.world if sharded else 1) if run.optim in ("adamw_torch", "adamw_hf") else 0.0


def step_moments(run: RunSpec, d: Dims, counts: ParamCounts, acts: Activations, step: _StepMemory) -> dict[str, float]:
    """Live tensor bytes at each moment of a step that can be its peak."""
    a = acts
    # start of backward: every saved activation, the loss buffers, no gradient of this step yet
    moments = {
        "activations (start of backward)": step.resident
        + a.saved_layers
        + a.outside_layers
        + a.logits
        + step.kept_grads
        + a.autocast_copies
        + a.dequant
    }
    if run.gradient_checkpointing:
        # the last layer is recomputed: its full activations on top of the saved layer inputs;
        # the loss buffers are gone, lm_head/norm gradients exist
        head_grads = (
            (counts.lm_head + counts.other + (counts.embedding if d.tied else 0))
            * (step.grads / max(step.trainable, 1))
            if run.finetuning_type == "full" and run.badam is None  # BAdam: the head is in no block
            else 0.0
        )
        moments["recompute (first layer of backward)"] = (
            step.resident
            + a.saved_layers
            + a.outside_in_backward
            + step.one_layer
            + max(step.kept_grads, head_grads)
            + a.autocast_copies
            + a.dequant
        )
    # end of backward: all gradients, the first layer's activations and backward buffers
    moments["gradients (end of backward)"] = step.resident + step.grads + step.one_layer + step.tied_extra + a.dequant
    moments["optimizer step"] = step.resident + step.grads + step.step_buffers
    return moments


def peak_terms(
    moment: str,
    moments: dict[str, float],
    run: RunSpec,
    d: Dims,
    counts: ParamCounts,
    acts: Activations,
    step: _StepMemory,
    grads_formula: str,
) -> list[Term]:
    """The terms alive at the peak moment besides the resident ones (they add up to its total)."""
    if moment.startswith("activations"):
        out = backward_start_terms(run, d, acts, step, grads_formula)
    elif moment.startswith("recompute"):
        out = recompute_terms(moments[moment], run, acts, step, grads_formula)
    elif moment.startswith("gradients"):
        out = backward_end_terms(run, acts, step, grads_formula)
    else:
        out = optimizer_step_terms(step, grads_formula)
    if acts.dequant and not moment.startswith("optimizer"):
        out.append(
            Term(
                "dequantize buffer",
                acts.dequant,
                f"largest linear {counts.max_linear / 1e6:.0f}M x {run.compute_bytes} B",
                "bitsandbytes dequantizes one weight at a time",
            )
        )
    return out


def backward_start_terms(run: RunSpec, d: Dims, acts: Activations, step: _StepMemory, grads_formula: str) -> list[Term]:
    """Peak terms at the start of backward: saved activations, loss buffers, kept gradients."""
    c, a, tokens = run.compute_bytes, acts, acts.tokens
    out = [
        Term(
            "gradients",
            step.kept_grads,
            grads_formula
            + (
                " (kept across accumulation)"
                if step.kept_grads
                else ": none yet at this moment (the step's gradients appear during backward)"
            ),
            ZERO_SOURCE,
        ),
        Term(
            "activations",
            a.saved_layers + a.outside_layers,
            a.formula + f" + outside layers {a.per_token['nonlayer']:.0f} B/token",
            ACTIVATION_SOURCE.format(attn=run.attn),
        ),
        Term(
            "logits / loss",
            a.logits,
            f"{chunk_logit_bytes(run)} B x vocab {d.vocab} x {CHUNK} positions: the chunked loss's one chunk "
            f"({chunk_logit_words(run)}), not {tokens} tokens",
            "cockpit.train.chunked_loss (torchtune's CEWithChunkedOutputLoss, TRL's chunked_nll)",
        )
        if run.stage != "rm" and not chunked_loss_why_not(run, d) and tokens > CHUNK
        else Term(
            "logits / loss",
            a.logits,
            (
                f"{chunk_logit_bytes(run)} B x vocab {d.vocab} x {tokens} tokens (the chunked loss: "
                f"{chunk_logit_words(run)})"
                if not chunked_loss_why_not(run, d)
                else f"3 x 4 B x vocab {d.vocab} x {tokens} tokens (fp32 log_softmax, its grad, grad of logits)"
            ),
            "HF ForCausalLMLoss upcasts logits to fp32",
        )
        if run.stage != "rm"
        else Term(
            "value head scores",
            a.logits,
            f"4 B x {tokens} tokens (one fp32 score per token, no vocabulary logits)",
            "reward model (rm)",
        ),
    ]
    if a.autocast_copies:
        out.append(
            Term(
                "autocast weight copies",
                a.autocast_copies,
                f"trainable linear weights x {c} B (autocast cache, saved for backward)",
                AUTOCAST_SOURCE,
            )
        )
    return out


def recompute_terms(total: float, run: RunSpec, acts: Activations, step: _StepMemory, grads_formula: str) -> list[Term]:
    """Peak terms while the last layer is recomputed (gradient checkpointing); ``total`` is the moment's bytes."""
    c, a = run.compute_bytes, acts
    grads_so_far = total - (
        step.resident + a.saved_layers + a.outside_in_backward + step.one_layer + a.autocast_copies + a.dequant
    )
    out = [
        Term(
            "gradients",
            grads_so_far,
            grads_formula
            + (" (kept across accumulation)" if step.kept_grads else ": only lm_head/final-norm gradients so far"),
            ZERO_SOURCE,
        ),
        Term(
            "activations",
            a.saved_layers + a.outside_in_backward + step.one_layer,
            a.formula + f" + the layer being recomputed and its backward buffers, {a.tokens} tokens",
            ACTIVATION_SOURCE.format(attn=run.attn),
        ),
    ]
    if a.autocast_copies:
        out.append(
            Term("autocast weight copies", a.autocast_copies, f"trainable linear weights x {c} B", AUTOCAST_SOURCE)
        )
    return out


def backward_end_terms(run: RunSpec, acts: Activations, step: _StepMemory, grads_formula: str) -> list[Term]:
    """Peak terms at the end of backward: all gradients, the first layer's activations."""
    out = [
        Term("gradients", step.grads, grads_formula, ZERO_SOURCE),
        Term(
            "activations",
            step.one_layer,
            f"first layer's activations + backward buffers, {acts.tokens} tokens",
            ACTIVATION_SOURCE.format(attn=run.attn),
        ),
    ]
    if step.tied_extra:
        out.append(
            Term(
                "tied embedding gradient",
                step.tied_extra,
                f"2 x vocab x hidden x {step.grads / max(step.trainable, 1):g} B",
                "autograd accumulates the embedding's and lm_head's gradients",
            )
        )
    return out


def optimizer_step_terms(step: _StepMemory, grads_formula: str) -> list[Term]:
    """Peak terms during the optimizer step: all gradients and the step's temporaries."""
    out = [Term("gradients", step.grads, grads_formula, ZERO_SOURCE)]
    if step.step_buffers:
        out.append(
            Term(
                "optimizer step buffers",
                step.step_buffers,
                "foreach AdamW: one fp32 temporary per trainable param",
                "torch.optim.AdamW(foreach=True)",
            )
        )
    return out


def overhead_term(run: RunSpec, overhead: float) -> Term:
    multi = run.world > 1
    return Term(
        "runtime overhead",
        overhead,
        f"{CONTEXT_BYTES / GiB:.1f} GiB context/kernels/BLAS workspaces"
        + (f" + {COLLECTIVE_BYTES / GiB:.1f} GiB RCCL buffers" if multi else "")
        + f" + {FRAGMENTATION:.0%} of tensor peak (allocator fragmentation)",
        "rule of thumb, see planner notes",
    )


def vlm_notes(run: RunSpec, counts: ParamCounts) -> list[str]:
    """A vision-language model: its vision tower and projector in the weights, which of them train, and
    that its image tokens are in the tokens planned (each sample's, up to cutoff_len)."""
    if not (counts.vision or counts.projector):
        return []
    frozen = [p for p in ("vision", "projector", "language") if p in run.vlm_frozen or run.finetuning_type != "full"]
    return [
        f"vision-language model: vision tower {counts.vision / 1e6:.2f}M + projector {counts.projector / 1e6:.2f}M "
        f"params in the weights ({', '.join(frozen) or 'nothing'} frozen"
        + (", LoRA on the parts that train" if run.finetuning_type == "lora" else "")
        + "); image tokens are tokens of the sample (cutoff_len bounds them with the text: cockpit check's images line)"
    ]


def planner_notes(run: RunSpec) -> list[str]:
    """Notes shown under the breakdown: what the estimate assumed that the config did not say."""
    notes = []
    if run.liger:
        notes.append(
            "enable_liger_kernel: fused linear cross-entropy, so no fp32 logits term; its RMSNorm/SwiGLU "
            "savings are not counted (an upper bound)"
        )
    if run.packing:
        tokens = run.micro_batch * run.cutoff_len
        notes.append(
            f"packing: each micro-batch is one row of up to {tokens} tokens (the samples' own lengths, no padding); "
            + {
                "fa2": "fa2 attends per sample (varlen)",
                "sdpa": "sdpa runs once per sample (causal, k/v not repeated); transformers still builds the "
                f"row's {tokens}x{tokens} bool mask",
            }.get(run.attn, f"{run.attn} attends through a {tokens}x{tokens} block-diagonal mask")
        )
    elif run.micro_batch > 1 and run.attn == "sdpa":
        notes.append(
            "micro-batch > 1: padded batches carry a mask, so SDPA repeats k/v to all heads and keeps a float mask per layer"
        )
    if run.offload_checkpoints and run.gradient_checkpointing:
        notes.append(
            "use_unsloth_gc: each checkpointed layer's input waits in host memory (CPU memory per rank), "
            "one at a time back on the device for its recompute"
        )
    if run.cutoff_len > 8192 and run.attn == "eager":
        notes.append("eager attention at long cutoff: the a*s^2 softmax dominates; use sdpa or fa2")
    notes += optimizer_notes(run)
    if run.finetuning_type == "oft":
        notes.append(
            "finetuning_type oft: the base's weights and activations are counted; OFT's blocks (about "
            "in_features x (oft_block_size - 1) / 2 per target) and their rotated inputs are not"
        )
    if run.stage in ("dpo", "kto", "grpo"):
        notes.append(f"reference model: {run.reference}")  # the words the rank's log says
    if run.stage == "grpo":
        notes.append(
            f"grpo: each trained sequence is the prompt + a sampled completion, up to {run.cutoff_len} tokens "
            f"(cutoff_len + max_completion_length {run.completion_len}); generation (no gradients, before the step) "
            f"holds a KV cache of {run.generation_seqs} sequences x {run.cutoff_len} tokens per rank, freed before "
            "the backward peak counted here (not added)"
        )
    return notes


def optimizer_notes(run: RunSpec) -> list[str]:
    """What the optimizer-state lines of GaLore / APOLLO / BAdam / Muon assume."""
    sharded = run.zero is not None or (run.fsdp is not None and run.fsdp.strategy != "no_shard")
    if run.low_rank is not None and sharded:
        return [
            f"use_{run.low_rank.kind} with DeepSpeed / FSDP: counted as sharded AdamW (the projected states are not modelled)"
        ]
    if run.low_rank is not None:
        return [
            f"use_{run.low_rank.kind}: gradients stay full-size until the step (per-layer mode frees them earlier: "
            "not counted, an upper bound)"
        ]
    if run.badam is not None and run.badam.mode == "layer":
        return [
            "use_badam (layer): activations as full fine-tuning with the first layer active (the worst block); "
            "later blocks keep fewer"
        ]
    if run.badam is not None:
        return ["use_badam (ratio): the per-shape update masks and one dense gradient at a time are not counted"]
    if run.muon:
        return [
            "use_muon: counted as AdamW (8 B per trainable parameter); Muon's 2-D weights keep one 4 B momentum "
            "each (an upper bound)"
        ]
    return []
