"""Mixture-of-experts facts from a model's config.json (torch-free: the planner, the check and the ranks ask).

A model is MoE when its config names routed experts (``num_experts`` in Qwen2/3-MoE and OLMoE,
``num_local_experts`` in Mixtral, gpt-oss, PhiMoE, ``n_routed_experts`` in DeepSeek-V2/V3, GLM-4-MoE)
and how many each token goes to (``num_experts_per_tok``, ``moe_k``, ``top_k``).

``moe_aux_loss_coef`` is LLaMA-Factory's key for the router's load-balancing loss; its
``model/model_utils/moe.py`` ``configure_moe`` sets the config's ``router_aux_loss_coef`` (DeepSeek:
``aux_loss_alpha``) to it and turns ``output_router_logits`` on, so that transformers' MoE forward adds
``coef * aux_loss`` to the loss. :func:`aux_loss_overrides` gives the same config values; a model
type whose forward has no such loss is refused by name (:func:`aux_loss_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOP_K_KEYS = ("num_experts_per_tok", "moe_k", "top_k", "moe_topk")
SHARED_KEYS = ("n_shared_experts", "num_shared_experts")

# model types whose transformers 5 forward adds router_aux_loss_coef * load_balancing_loss to the
# loss when output_router_logits is on (read from transformers 5.23's modeling files)
ROUTER_AUX_LOSS = frozenset(
    {
        "qwen2_moe", "qwen3_moe", "qwen3_next", "mixtral", "gpt_oss", "olmoe", "phimoe", "granitemoe",
        "granitemoeshared", "granitemoehybrid", "ernie4_5_moe", "minimax", "minimax_m2", "flex_olmo", "jamba",
    }
)  # fmt: skip

# a router's module name (its last part): frozen under lora_target: all unless named
ROUTER_NAMES = frozenset({"gate", "router", "shared_expert_gate"})


@dataclass(frozen=True)
class Experts:
    """Routed experts per MoE layer, how many each token goes to, and always-on shared experts."""

    routed: int
    top_k: int
    shared: int = 0

    @property
    def active_share(self) -> float:
        """The share of the routed experts' weights a token runs through."""
        return self.top_k / self.routed if self.routed else 1.0


def _first_int(model_config: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    for key in keys:
        value = model_config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def experts_of(model_config: Mapping[str, Any]) -> Experts | None:
    """The model's experts, or None for a dense model."""
    routed = _first_int(model_config, EXPERT_COUNT_KEYS)
    if routed <= 1:
        return None
    top_k = _first_int(model_config, TOP_K_KEYS) or 1
    return Experts(routed=routed, top_k=min(top_k, routed), shared=_first_int(model_config, SHARED_KEYS))


def is_moe(model_config: Mapping[str, Any]) -> bool:
    return experts_of(model_config) is not None


def aux_loss_problem(model_config: Mapping[str, Any]) -> str | None:
    """Why ``moe_aux_loss_coef`` cannot apply to this model (None: it can)."""
    model_type = str(model_config.get("model_type", ""))
    if not is_moe(model_config):
        return f"the model ({model_type or 'unknown type'}) has no routed experts: there is no router loss to weight"
    if model_type not in ROUTER_AUX_LOSS:
        return (
            f"model type {model_type!r}'s forward in transformers adds no router load-balancing loss; "
            f"moe_aux_loss_coef applies to {', '.join(sorted(ROUTER_AUX_LOSS))}"
        )
    return None


def aux_loss_overrides(coef: float | None) -> dict[str, Any]:
    """The config values LLaMA-Factory's ``configure_moe`` sets for a trained MoE model."""
    if coef is None:
        return {}
    return {"router_aux_loss_coef": float(coef), "output_router_logits": True}


def expert_parameters(model: Any) -> list[str]:
    """PEFT ``target_parameters`` for a model's fused expert tensors (``mlp.experts.gate_up_proj``, ...):
    the 3-D weights of each ``...experts`` module (biases and routers left out; per-expert linear layers,
    an ``nn.ModuleList``, are linear targets instead). Reads the module tree only (no torch import)."""
    names: set[str] = set()
    for name, module in model.named_modules():
        if not name.endswith("experts") or type(module).__name__ == "ModuleList":
            continue
        for pname, p in module.named_parameters(recurse=False):
            if len(getattr(p, "ds_shape", None) or p.shape) == 3:  # ZeRO-3 keeps a partitioned one's shape there
                names.add(".".join([*name.rsplit(".", 2)[-2:], pname]))
    return sorted(names)
