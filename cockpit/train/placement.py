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

from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from cockpit.train.progress import OnProgress, probes_reporter, silent

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments


class ProbesBeforeTraining(TrainerCallback):  # type: ignore[misc]  # TrainerCallback is Any here (follow_imports = skip)
    def __init__(
        self,
        tokenizer: Any,
        probes: list[dict[str, Any]],
        max_new_tokens: int,
        writer: Any,
        rank: int,
        *,
        fsdp: bool,
        log: Callable[[str], object] = print,
    ) -> None:
        self.tokenizer, self.probes, self.max_new_tokens = tokenizer, probes, max_new_tokens
        self.writer, self.rank, self.fsdp, self.log = writer, rank, fsdp, log
        self.trainer: Any = None  # set once the Trainer exists: its .model is the placed, wrapped-for-strategy module
        self.result: dict[str, Any] | None = None
        self.resumed_run: Any = None  # a resumed attempt's RunDir: an earlier attempt's answers stand
        self.should_stop: Any = None  # one process: a stop request ends the answers (stop_pending)
        self._done = False

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._done or not self.probes:
            return
        self._done = True
        earlier = earlier_before(self.resumed_run, self.rank, "probe_results", self.probes)
        if earlier is not None:
            self.result = earlier or None  # {} on the other ranks: they only learn that rank 0 has them
            self.log("probes before training: an earlier attempt's answers stand (not asked again)")
            if self.rank == 0 and self.writer is not None and earlier:
                self.writer.emit("probe_results", phase="before", reused=True, **earlier)
            return
        model = self.trainer.model if self.trainer is not None else kwargs["model"]
        on_progress = probes_reporter(self.writer if self.rank == 0 else None, "before")
        self.result = ask_before(
            model,
            self.tokenizer,
            self.probes,
            self.max_new_tokens,
            fsdp=self.fsdp,
            on_progress=on_progress,
            should_stop=self.should_stop,
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
    should_stop: Any = None,
) -> dict[str, Any]:
    """The base model's answers (adapter disabled), on the device its parameters are on; ``should_stop``:
    ``run_probes``'."""
    import torch

    from cockpit.strategy.fsdp import gathered_root
    from cockpit.train.probes import run_probes

    device = next(model.parameters()).device
    if fsdp:  # FSDP2 initialises its hooks at the root's first forward, which generate would skip
        with torch.no_grad():
            model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=device))
    adapter_off = model.disable_adapter() if hasattr(model, "disable_adapter") else nullcontext()
    with gathered_root(model) if fsdp else nullcontext(), adapter_off:
        result = run_probes(model, tokenizer, probes, max_new_tokens, on_progress=on_progress, should_stop=should_stop)
    return {**result, "device": str(device)}


def earlier_before(run: Any, rank: int, kind: str, probes: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """A resumed attempt (``run``: its RunDir; None: not a resume): the last ``kind`` event (``probe_results``
    or ``held_out``) of phase "before" an earlier attempt wrote, as its result fields, when it answered
    these ``probes`` (the same prompts and expectations); None when there is none (ask again). Rank 0
    reads the event log; the other ranks learn from it whether there is one (``{}``), so every rank
    skips or asks together (a sharded model generates collectively)."""
    found: dict[str, Any] | None = None
    if rank == 0 and run is not None:
        from cockpit.store.events import read_all

        for ev in read_all(run.events_path):
            if ev.get("kind") == kind and ev.get("phase") == "before":
                found = {k: v for k, v in ev.items() if k not in ("v", "t", "kind", "phase", "stage", "reused")}
        if found is not None and probes is not None:
            asked = [(r.get("prompt"), r.get("expect")) for r in found.get("results") or []]
            if asked != [(p["prompt"], p["expect"]) for p in probes]:
                found = None  # the probes changed (resume --set probes=...): ask the new ones
    from cockpit.train.callbacks import distributed

    dist = distributed()
    if dist is not None and dist.get_world_size() > 1:
        flag = [found is not None]
        dist.broadcast_object_list(flag, src=0)
        return found if rank == 0 else ({} if flag[0] else None)
    return found


def stop_pending(run: Any, world_size: int) -> Any:
    """What ends the probes before training early: a pending stop request, in a one-process run only
    (with several ranks every rank must answer as many batches: a sharded model generates collectively)."""
    return (lambda: run.pending("stop")) if world_size == 1 else None
