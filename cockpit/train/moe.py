"""A mixture-of-experts model in the rank: what its routers do, read by forward hooks.

:class:`RouterWatch` (one per rank, attached by ``CockpitTrainer``) sums over each logging interval
- the router's load-balancing loss the model's forward returned (``aux_loss``, with
  ``moe_aux_loss_coef``: transformers computes it once ``output_router_logits`` is on), and
- per MoE layer, the tokens each router sent to each expert (its top-k choices: a ``bincount`` on the
  device, no host sync per step),
in training forwards only. At each logging step (every rank: ``CockpitTrainer.log``) both are summed
over the ranks (one all-reduce) and read; rank 0's callback writes them in the ``step`` event
(``aux_loss``, ``expert_load``: :mod:`cockpit.store.expert_load`).

``lora_target: all`` on an MoE model (:func:`lora_targets`): every linear layer but the LM head and
the routers, and the experts' weights whatever form transformers gives them (per-expert
``nn.Linear``, or fused 3-D expert tensors: PEFT's ``target_parameters``); the router stays frozen
unless named.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from cockpit.models.moe import ROUTER_NAMES, expert_parameters, experts_of

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def base_of(model: Any) -> Any:
    """The transformers model under a PEFT / DDP / DeepSpeed wrapper."""
    while hasattr(model, "module") and not hasattr(model, "config"):
        model = model.module
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _routers(model: Any, experts: int) -> list[tuple[int, Any]]:
    """(layer index, router module) in layer order: a module whose class is a ``...Router``, else a
    ``gate`` / ``router`` linear layer with one output per expert."""
    found: dict[int, Any] = {}
    for name, module in model.named_modules():
        match = _LAYER.search(name + ".")
        if match is None or int(match.group(1)) in found:
            continue
        leaf = name.rsplit(".", 1)[-1]
        is_router = type(module).__name__.endswith("Router")
        linear = isinstance(module, torch.nn.Linear) and leaf in ROUTER_NAMES and module.out_features == experts
        if is_router or linear:
            found[int(match.group(1))] = module
    return sorted(found.items())


def _choices(output: Any, experts: int, top_k: int) -> Any:
    """The experts a router chose per token (an integer tensor), from what it returned."""
    parts = output if isinstance(output, (tuple, list)) else (output,)
    for part in parts:
        if isinstance(part, torch.Tensor) and not part.is_floating_point() and part.ndim >= 1:
            return part
    for part in parts:  # router logits only: its top-k
        if isinstance(part, torch.Tensor) and part.shape[-1] == experts:
            return part.detach().topk(top_k, dim=-1).indices
    return None


class RouterWatch:
    def __init__(self, model: Any, experts: int, top_k: int, routers: list[tuple[int, Any]]) -> None:
        self.experts, self.top_k = experts, top_k
        self.layers = [layer for layer, _ in routers]
        self.counts: Any = None  # layers x experts, on the routers' device
        self.aux_sum: Any = None
        self.aux_n = 0
        self.last_aux: float | None = None  # read at the last logging step (all ranks)
        self.last_counts: list[list[float]] | None = None
        self.device = _first_device(routers[0][1])  # where the sums live before the first forward (the router's)
        self._slot = {id(module): i for i, (_, module) in enumerate(routers)}
        self.handles = [module.register_forward_hook(self._on_router) for _, module in routers]
        self.handles.append(base_of(model).register_forward_hook(self._on_model))

    @classmethod
    def attach(cls, model: Any) -> RouterWatch | None:
        """The watch of an MoE model's routers, or None for a dense model (or routers not found)."""
        base = base_of(model)
        config = getattr(base, "config", None)
        found = experts_of(config.to_dict()) if config is not None else None
        if found is None:
            return None
        routers = _routers(base, found.routed)
        if not routers:
            return None
        return cls(model, found.routed, found.top_k, routers)

    def _on_router(self, module: Any, _inputs: Any, output: Any) -> None:
        if not module.training:
            return
        chosen = _choices(output, self.experts, self.top_k)
        if chosen is None:
            return
        counts = torch.bincount(chosen.reshape(-1).long(), minlength=self.experts)[: self.experts]
        if self.counts is None:
            self.counts = torch.zeros(len(self.layers), self.experts, dtype=torch.float64, device=counts.device)
        self.counts[self._slot[id(module)]] += counts.to(self.counts.device, torch.float64)

    def _on_model(self, module: Any, _inputs: Any, output: Any) -> None:
        aux = getattr(output, "aux_loss", None) if not isinstance(output, dict) else output.get("aux_loss")
        if not module.training or not isinstance(aux, torch.Tensor):
            return
        aux = aux.detach().float().reshape(())
        self.aux_sum = aux if self.aux_sum is None else self.aux_sum + aux.to(self.aux_sum.device)
        self.aux_n += 1

    def take(self, world_size: int) -> None:
        """At a logging step, on every rank: the interval's mean aux loss and the expert counts, summed
        over the ranks, into ``last_aux`` / ``last_counts``; the sums start again."""
        device = self.counts.device if self.counts is not None else self.device
        counts = self.counts if self.counts is not None else torch.zeros(len(self.layers), self.experts, device=device)
        aux = torch.zeros(2, dtype=torch.float64, device=device)
        if self.aux_sum is not None:
            aux[0] = self.aux_sum.to(device, torch.float64)
            aux[1] = float(self.aux_n)
        packed = torch.cat([aux, counts.to(torch.float64).reshape(-1)])
        if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(packed)
        values = packed.tolist()
        self.last_aux = values[0] / values[1] if values[1] else None
        flat = values[2:]
        self.last_counts = [flat[i * self.experts : (i + 1) * self.experts] for i in range(len(self.layers))]
        if not any(any(row) for row in self.last_counts):
            self.last_counts = None
        self.counts, self.aux_sum, self.aux_n = None, None, 0

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _first_device(model: Any) -> Any:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def lora_targets(model: Any) -> tuple[list[str], list[str]] | None:
    """``lora_target: all`` on an MoE model: (PEFT target_modules, target_parameters), every linear
    layer but the LM head and the routers, and the fused experts' tensors; None for a dense model."""
    base = base_of(model)
    config = getattr(base, "config", None)
    if config is None or experts_of(config.to_dict()) is None:
        return None
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    modules: set[str] = set()
    for name, module in base.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Linear) and module is not head and leaf not in ROUTER_NAMES:
            modules.add(leaf)
    return sorted(modules), expert_parameters(base)


def moe_block_classes(model: Any) -> list[type]:
    """The classes of an MoE model's sparse blocks: a module with an ``experts`` child and a router
    (``gate`` / ``router``) child (Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock, GptOssMLP, ...)."""
    found: dict[str, type] = {}
    for module in model.modules():
        children = dict(module.named_children())
        if "experts" in children and ROUTER_NAMES & children.keys():
            found.setdefault(type(module).__qualname__, type(module))
    return list(found.values())


def mark_zero3_leaves(model: Any, log: Any = None) -> list[str]:
    """ZeRO-3: each MoE block a leaf module (``deepspeed.utils.set_z3_leaf_modules``, as LLaMA-Factory's
    ``add_z3_leaf_module`` does for Mixtral / Qwen MoE): its parameters are gathered at once when the block
    runs, instead of module by module on a trace that changes with the routing. That matters for experts
    kept as a list of modules (remote-code models, transformers 4): an expert no token reached is never
    called, the prefetch waits for it, and the run hangs. transformers 5's fused experts are one module,
    always called: the small Qwen3-MoE trains under ZeRO-3 on 2 CPU ranks with or without this (measured,
    same losses). The class names marked."""
    classes = moe_block_classes(model)
    if not classes:
        return []
    from deepspeed.utils import set_z3_leaf_modules

    set_z3_leaf_modules(model, classes)
    names = [c.__name__ for c in classes]
    if log is not None:
        log(f"ZeRO-3: MoE blocks gathered whole (leaf modules): {', '.join(names)}")
    return names
