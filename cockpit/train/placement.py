"""Probes before training, asked on the training device by every rank.

They run at ``on_train_begin``: the Trainer has placed the model on ``args.device``
(``cuda:LOCAL_RANK``, which is ROCm's device too), DeepSpeed ZeRO-3 has installed its gather
hooks and FSDP2 has sharded it, so the sharded model generates with every rank joining, as
after training. Every rank asks the same probes, greedily, at the same moment: no rank waits in a
collective while another generates, however long the probes take (the collective timeout,
``ddp_timeout``, only ever sees the small skew between ranks). Rank 0 writes the event, with
the device the answers were computed on.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

from transformers import TrainerCallback

from cockpit.train.progress import OnProgress, probes_reporter, silent


class ProbesBeforeTraining(TrainerCallback):
    def __init__(
        self,
        tokenizer: Any,
        probes: list[dict[str, Any]],
        max_new_tokens: int,
        writer: Any,
        rank: int,
        *,
        fsdp: bool,
        log=print,
    ):
        self.tokenizer, self.probes, self.max_new_tokens = tokenizer, probes, max_new_tokens
        self.writer, self.rank, self.fsdp, self.log = writer, rank, fsdp, log
        self.trainer: Any = None  # set once the Trainer exists: its .model is the placed, wrapped-for-strategy module
        self.result: dict[str, Any] | None = None
        self._done = False

    def on_train_begin(self, args, state, control, **kwargs):
        if self._done or not self.probes:
            return
        self._done = True
        model = self.trainer.model if self.trainer is not None else kwargs["model"]
        on_progress = probes_reporter(self.writer if self.rank == 0 else None, "before")
        self.result = ask_before(
            model, self.tokenizer, self.probes, self.max_new_tokens, fsdp=self.fsdp, on_progress=on_progress
        )
        self.log(f"probes before training on {self.result['device']}: {self.result['passed']}/{self.result['total']}")
        if self.rank == 0 and self.writer is not None:
            self.writer.emit("probe_results", phase="before", **self.result)


def ask_before(
    model: Any,
    tokenizer: Any,
    probes: list[dict[str, Any]],
    max_new_tokens: int,
    *,
    fsdp: bool,
    on_progress: OnProgress = silent,
) -> dict[str, Any]:
    """The base model's answers (adapter disabled), on the device its parameters are on."""
    import torch

    from cockpit.strategy.fsdp import gathered_root
    from cockpit.train.probes import run_probes

    device = next(model.parameters()).device
    if fsdp:  # FSDP2 initialises its hooks at the root's first forward, which generate would skip
        with torch.no_grad():
            model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device))
    adapter_off = model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext()
    with gathered_root(model) if fsdp else nullcontext(), adapter_off:
        result = run_probes(model, tokenizer, probes, max_new_tokens, on_progress=on_progress)
    return {**result, "device": str(device)}
