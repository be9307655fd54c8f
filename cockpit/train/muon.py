"""``use_muon``: LLaMA-Factory's Muon optimizer (``train/trainer_utils._create_muon_optimizer`` over its
``third_party/muon``, after Moonshot AI's Moonlight and Keller Jordan's Muon), built from torch's own
classes.

As LLaMA-Factory splits the trainable parameters: every 2-D one whose name holds neither ``embed`` nor
``lm_head`` (the decoder's weight matrices, LoRA's A and B) goes to ``torch.optim.Muon``, the rest
(embeddings, the head, norms, biases) to ``torch.optim.AdamW``; one learning rate and weight decay
(``learning_rate``, ``weight_decay``) for both, AdamW's betas and epsilon from ``adam_beta1/2`` /
``adam_epsilon``. torch's Muon with ``adjust_lr_fn="match_rms_adamw"`` is LLaMA-Factory's
``adjust_lr_for_muon`` (``lr x 0.2 x sqrt(max(rows, cols))``) with the same Newton-Schulz coefficients
(5 steps), Nesterov momentum 0.95 and decoupled decay ``p x (1 - lr x wd)``; its momentum is an
average (``lerp``) where LLaMA-Factory's is a sum, which the orthogonalisation's normalisation cancels.

HF's Trainer and its LR scheduler take one optimizer: :class:`MuonWithAdamW` is the two as one, with
the two parts' own parameter groups (the scheduler's learning rate reaches both) and both parts'
states in its state dict (checkpoints resume them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def goes_to_muon(name: str, param: Any) -> bool:
    """LLaMA-Factory's rule: 2-D, and not an embedding or the LM head."""
    return param.ndim == 2 and "embed" not in name and "lm_head" not in name


class MuonWithAdamW(torch.optim.Optimizer):  # type: ignore[misc]  # torch.optim.Optimizer is Any here (follow_imports = skip)
    """``torch.optim.Muon`` over ``muon_params`` and ``torch.optim.AdamW`` over ``adamw_params``, stepped
    together as one optimizer (``parts``: the one or two built)."""

    def __init__(
        self,
        muon_params: Iterable[Any],
        adamw_params: Iterable[Any],
        *,
        lr: float,
        weight_decay: float,
        betas: tuple[float, float],
        eps: float,
    ) -> None:
        muon_params, adamw_params = list(muon_params), list(adamw_params)
        self.parts: list[torch.optim.Optimizer] = []
        if muon_params:
            self.parts.append(
                torch.optim.Muon(muon_params, lr=lr, weight_decay=weight_decay, adjust_lr_fn="match_rms_adamw")
            )
        if adamw_params:
            self.parts.append(torch.optim.AdamW(adamw_params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        super().__init__(muon_params + adamw_params, {"lr": lr, "weight_decay": weight_decay})
        # the parts' own group dicts: what a scheduler writes into a group's lr is what the part steps with
        self.param_groups = [group for part in self.parts for group in part.param_groups]

    @property
    def state(self) -> dict[Any, Any]:
        merged: dict[Any, Any] = {}
        for part in getattr(self, "parts", []):
            merged.update(part.state)
        return merged

    @state.setter
    def state(self, value: Any) -> None:  # Optimizer.__init__ assigns an empty one; the parts keep theirs
        pass

    def step(self, closure: Any = None) -> Any:
        with torch.no_grad():  # torch.no_grad() as a decorator would make step untyped (torch is Any here)
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            for part in self.parts:
                part.step()
            return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = state_dict["parts"]
        if len(saved) != len(self.parts):
            raise ValueError(f"the checkpoint's Muon optimizer has {len(saved)} parts, this one {len(self.parts)}")
        for part, part_state in zip(self.parts, saved, strict=True):
            part.load_state_dict(part_state)


def muon_optimizer(model: Any, args: Any) -> MuonWithAdamW:
    """The Muon optimizer over ``model``'s trainable parameters, as LLaMA-Factory builds it."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return MuonWithAdamW(
        [p for n, p in named if goes_to_muon(n, p)],
        [p for n, p in named if not goes_to_muon(n, p)],
        lr=args.learning_rate,
        weight_decay=args.weight_decay,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
    )
