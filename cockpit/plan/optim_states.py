"""Optimizer-state memory of the optimizers that keep less than AdamW's two moments per parameter.

* GaLore (Zhao et al. 2024, "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
  Projection", sec. 4; galore_torch's ``GaLoreProjector``): a targeted m x n linear weight's gradient
  is projected to rank r before Adam sees it, so its two moments have the projected shape and the
  projection matrix is kept beside them. ``proj_type`` std projects onto the smaller side: moments
  r x max(m, n) each, projection r x min(m, n); reverse_std the other way round; right (m x r
  moments, r x n projection); left (r x n, m x r); full (r x r moments, both projections).
* APOLLO (Zhu et al. 2024, "APOLLO: SGD-like Memory, AdamW-level Performance"; apollo_torch's
  ``GradientProjector``): the same layout with a random projection (kept as a matrix between
  its updates); APOLLO-Mini is rank 1.
* BAdam (Luo et al. 2024, "BAdam: A Memory Efficient Full Parameter Optimization Method for Large
  Language Models", sec. 2.3; badam's ``BlockOptimizer``): layer mode trains one decoder layer at a
  time, so only that layer has gradients, an fp32 copy (the update's master weights) and Adam
  moments (dropped at each switch); the embeddings, LM head and final norm are in no block. Ratio
  mode (``BlockOptimizerRatio``): a sparse Adam over ``badam_update_ratio`` of the entries of every
  parameter but the embeddings, its gradients sparse COO tensors (fp32 value + two int64 indices).

Every other trainable parameter keeps AdamW's moments. Pure arithmetic, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from cockpit.plan.params import Dims, ParamCounts, linear_shapes
from cockpit.plan.spec import RunSpec

GALORE_SOURCE = "GaLore (Zhao et al. 2024) sec. 4; galore_torch GaLoreProjector"
APOLLO_SOURCE = "APOLLO (Zhu et al. 2024); apollo_torch GradientProjector (random projection)"
BADAM_SOURCE = "BAdam (Luo et al. 2024) sec. 2.3; badam BlockOptimizer / BlockOptimizerRatio"
SPARSE_GRAD_BYTES = 4 + 2 * 8  # a COO entry of a 2-D weight: fp32 value, two int64 indices


@dataclass
class StateModel:
    """Optimizer states (and what they replace), gradients and master copies of one optimizer."""

    optimizer: float  # bytes of the optimizer states
    optimizer_formula: str
    source: str
    adamw: float  # what AdamW's two moments over the same trainable parameters would take
    grads: float
    grads_formula: str
    master: float = 0.0  # BAdam layer mode: the active layer's fp32 copy
    master_formula: str = ""


def projected_elements(m: int, n: int, rank: int, proj_type: str) -> tuple[int, int]:
    """(elements of both moments, elements of the projection) of an m x n (out x in) weight."""
    r = min(rank, m, n)
    big, small = max(m, n), min(m, n)
    if proj_type == "std":
        return 2 * r * big, r * small
    if proj_type == "reverse_std":
        return 2 * r * small, r * big
    if proj_type == "right":
        return 2 * r * m, r * n
    if proj_type == "left":
        return 2 * r * n, r * m
    return 2 * r * r, r * (m + n)  # full: both sides projected


def low_rank_matrices(run: RunSpec, d: Dims, counts: ParamCounts) -> list[tuple[str, int, int, int]]:
    """(module, m = out, n = in, how many) of the linear weights GaLore / APOLLO project: every
    decoder linear of the trained layers (and an untied LM head in full fine-tuning) for ``all``,
    else the named ones (HF's ``optim_target_modules``)."""
    assert run.low_rank is not None
    shapes = {name: (out, inp) for name, (inp, out) in linear_shapes(d).items() if name in counts.linear_names}
    layers = counts.layers
    if run.finetuning_type == "freeze":
        layers = min(abs(run.freeze_trainable_layers), counts.layers)
    head = counts.lm_head > 0 and run.finetuning_type == "full"
    target = run.low_rank.target.strip().lower()
    names = list(shapes) + (["lm_head"] if head else []) if target == "all" else [t.strip() for t in target.split(",")]
    out = [(name, *shapes[name], layers) for name in names if name in shapes]
    if "lm_head" in names and head:
        out.append(("lm_head", d.vocab, d.hidden, 1))
    return out


def low_rank_states(run: RunSpec, d: Dims, counts: ParamCounts, trainable: int, adam: float) -> StateModel:
    """GaLore / APOLLO: projected moments + projection per targeted weight, AdamW for the rest."""
    spec = run.low_rank
    assert spec is not None
    moment_bytes = adam / 2  # one moment's bytes per element (fp32: 4; 8-bit: ~1)
    projected = moments = projection = 0
    for _name, m, n, count in low_rank_matrices(run, d, counts):
        mom, proj = projected_elements(m, n, spec.rank, spec.proj_type)
        projected += m * n * count
        moments += mom * count
        projection += proj * count
    rest = max(trainable - projected, 0)
    optimizer = moments * moment_bytes + projection * 4 + rest * adam
    side = {
        "std": "2 x r x max(m,n) moments + r x min(m,n) projection",
        "reverse_std": "2 x r x min(m,n) moments + r x max(m,n) projection",
        "right": "2 x m x r moments + r x n projection",
        "left": "2 x r x n moments + m x r projection",
        "full": "2 x r x r moments + r x (m+n) projections",
    }[spec.proj_type]
    formula = (
        f"{spec.kind} r={spec.rank} ({spec.proj_type}) on {projected / 1e9:.3f}B params of linear weights: "
        f"{side} = {moments / 1e6:.2f}M x {moment_bytes:g} B + {projection / 1e6:.2f}M x 4 B; "
        f"{rest / 1e9:.3f}B other trainable x {adam:g} B (AdamW m, v); "
        f"AdamW alone: {trainable / 1e9:.3f}B x {adam:g} B"
    )
    return StateModel(
        optimizer=optimizer,
        optimizer_formula=formula,
        source=GALORE_SOURCE if spec.kind == "galore" else APOLLO_SOURCE,
        adamw=trainable * adam,
        grads=trainable * 4,
        grads_formula=f"{trainable / 1e9:.3f}B trainable x 4 B (fp32; GaLore/APOLLO project them at the step)",
    )


def badam_active(run: RunSpec, counts: ParamCounts) -> int:
    """Parameters BAdam updates: the largest decoder layer (layer mode), or every parameter but the
    embeddings (and an untied LM head) in ratio mode (of which badam_update_ratio per step)."""
    assert run.badam is not None
    if run.badam.mode == "layer":
        return counts.per_layer
    return counts.total - counts.embedding - counts.lm_head


def badam_states(run: RunSpec, counts: ParamCounts, adam: float) -> StateModel:
    """BAdam: Adam moments (and gradients, and in layer mode an fp32 copy) of the active block only."""
    spec = run.badam
    assert spec is not None
    adamw = counts.total * adam
    active = badam_active(run, counts)
    if spec.mode == "layer":
        million = f"{active / 1e6:.2f}M"
        return StateModel(
            optimizer=active * adam,
            optimizer_formula=f"active layer {million} x {adam:g} B (AdamW m, v of one decoder layer; "
            f"dropped at each switch); AdamW alone: {counts.total / 1e9:.3f}B x {adam:g} B",
            source=BADAM_SOURCE,
            adamw=adamw,
            grads=active * 4,
            grads_formula=f"active layer {million} x 4 B (only its parameters require grad; fp32 at the update)",
            master=active * 4,
            master_formula=f"active layer {million} x 4 B (BAdam's fp32 copy, the one it updates)",
        )
    entries = active * spec.update_ratio
    return StateModel(
        optimizer=entries * adam,
        optimizer_formula=f"{spec.update_ratio:g} x {active / 1e9:.3f}B non-embedding params x {adam:g} B "
        f"(sparse Adam m, v of the updated entries); AdamW alone: {counts.total / 1e9:.3f}B x {adam:g} B",
        source=BADAM_SOURCE,
        adamw=adamw,
        grads=entries * SPARSE_GRAD_BYTES,
        grads_formula=f"{spec.update_ratio:g} x {active / 1e9:.3f}B x {SPARSE_GRAD_BYTES} B "
        "(sparse COO gradients: fp32 value + two int64 indices)",
    )
