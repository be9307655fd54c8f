"""HF Trainer callback: step events, NaN / spike / memory-pressure alerts, the run dir's stop / save requests.

All ranks run it (the Trainer calls callbacks on every process); only rank 0 writes events.
Control requests are agreed across ranks with one tiny all-reduce per step, so every rank
stops or saves at the same step (a rank that stopped alone would hang the others).
"""

from __future__ import annotations

import math
import os
import socket
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from cockpit.config.notes import steps_per_epoch
from cockpit.store.events import EventWriter
from cockpit.store.expert_load import LoadWatch, encode
from cockpit.store.rundir import RunDir
from cockpit.telemetry import node as node_telemetry
from cockpit.telemetry import rank_memory_stats
from cockpit.telemetry.pressure import MemoryPressure
from cockpit.telemetry.step_health import EarlyGradNorm, SlowStep

if TYPE_CHECKING:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from cockpit.config.run_config import RunConfig


def warmup_steps_for(total_steps: int) -> int:
    """Steps left out of tokens/s: the first tenth, 1 to 5 (first steps build the optimizer
    states and, on GPUs, tune kernels and grow the allocator's pools)."""
    return max(1, min(5, int(total_steps) // 10))


def planned_epochs(total_steps: int, per_epoch: int | None, configured: float) -> float:
    """The epochs the run's steps make (``max_steps`` 8 of 11.4 per epoch: 0.7), else the config's."""
    return round(total_steps / per_epoch, 4) if per_epoch else float(configured)


_UNSET = object()
# fp16's loss scaler skips a step whose gradients overflow and lowers the scale: the weights are unchanged,
# so a skipped step is no NaN. This many skipped logging steps in a row are: no scale gives finite gradients
SKIPPED_STEPS_LIMIT = 20


def distributed() -> Any:
    """``torch.distributed`` when a process group is up, else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def control_group(dist: Any) -> Any:
    """The process group the stop / save flags travel on: the default group when it is gloo already (a
    CPU run), else a gloo side group. On NCCL / RCCL the flags' all-reduce and ``.item()`` were a device
    synchronisation at every step (the host waited for the GPU's queue); on gloo they are a small host
    message. Every rank calls this at the same point (``new_group`` is collective)."""
    return None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")


def agreed_flags(dist: Any, flags: list[bool], group: Any) -> list[bool]:
    """Each flag true on any rank is true on every rank: a MAX all-reduce of host tensors on ``group``."""
    import torch

    t = torch.tensor([float(f) for f in flags])
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return [bool(v) for v in t.tolist()]


class CockpitCallback(TrainerCallback):  # type: ignore[misc]  # TrainerCallback is Any here (follow_imports = skip)
    def __init__(self, run: RunDir, cfg: RunConfig, rank: int, world_size: int, writer: EventWriter | None) -> None:
        self.run = run
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.writer = writer  # rank 0 only
        self.recent: deque[float] = deque(maxlen=20)
        self.last_t: float | None = None
        self.last_tokens = 0
        self.last_step = 0
        self.first_loss: float | None = None
        self.last_loss: float | None = None
        self.first_loss_step: int | None = None  # the steps they were logged at (the same one when
        self.last_loss_step: int | None = None  # logging_steps exceeds the steps run)
        self.start_t = time.time()
        self.tokens_total = 0
        self.stop_reason: str | None = None
        self.stop_requested = False  # a stop request (cockpit stop, the cockpit's x) ended the training
        self.nan_seen = False
        self.nan_step: int | None = None
        self.skipped_in_a_row = 0  # logging steps whose update the loss scaler skipped, in a row
        self.told_skipped = False  # the first skipped update's alert is out
        # whether the loss scaler skipped the last update: set by recipes.base.train from the trainer's
        # optimizer (HF hands callbacks the optimizer it was built with, not the one it steps)
        self.update_skipped: Callable[[], bool] = lambda: False
        self.node_rank = int(os.environ.get("GROUP_RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.host = socket.gethostname()
        self.pressure = MemoryPressure(cfg.memory_alert_headroom, cfg.memory_alert_swing)
        self.slow_step = SlowStep()  # the ROCm field guide's Live alerts (docs/rocm.md items 6, 7)
        self.early_norm = EarlyGradNorm()
        self.tracker: Any = None  # the CPU's live-tensor tracker (cpu_memory_tracker), entered for training only
        self.warmup_steps = 1
        self._start_step = 0  # the step training began (or resumed) at
        self.warm_mark: tuple[float, int] | None = None  # (time, tokens seen) when warm-up ended
        self.warm_step = 0  # the last warm-up step
        self.end_mark: tuple[float, int] | None = None  # (time, tokens seen) at the last step
        self._control_group: Any = _UNSET  # the flags' process group, made at the first step (control_group)
        self.meter: Any = None  # rank 0's FlopsMeter (MFU, per-device throughput), made at on_train_begin
        self.global_batch = 0  # samples per optimizer step, all ranks
        self._first_step_began = False  # on_step_begin restarted the clock for this attempt's first step
        self.router_watch: Any = None  # an MoE model's RouterWatch, set by CockpitTrainer (cockpit.train.moe)
        self.load_watch = LoadWatch()  # rank 0: experts nearly unused or overloaded, logging step after step

    # -- helpers ----------------------------------------------------------------------------
    def emit(self, kind: str, **fields: Any) -> None:
        if self.writer is not None:
            self.writer.emit(kind, **fields)

    def alert(
        self,
        control: TrainerControl,
        *,
        level: str,
        code: str,
        message: str,
        remedies: list[str],
        policy: str,
        stop_reason: str,
        save: bool = True,
    ) -> None:
        """An ``alert`` event; with ``policy`` "stop", training stops at this step, with a
        checkpoint when ``save`` (never after a NaN: that state is poisoned)."""
        self.emit("alert", level=level, code=code, message=message, remedies=remedies, policy=policy)
        if policy == "stop":
            control.should_training_stop = True
            control.should_save = save
            self.stop_reason = stop_reason

    def weights_poisoned(self, trainer: Any, step: int, what: str) -> None:
        """The trainer stopped because the update of ``step`` made the weights unusable
        (``recipes.base.PoisonedWeights``): the NaN rule's alert and stop, then the end of training
        the trainer did not reach."""
        self.nan_seen = True
        self.nan_step = self.nan_step or step
        self.alert(
            trainer.control,
            level="error",
            code="nan_loss",
            message=what,
            remedies=["lower learning_rate", "set max_grad_norm (gradient clipping)", "use bf16 instead of fp16"],
            policy="stop",  # sampling from these weights cannot go on, whatever nan_policy says
            stop_reason=f"weights became nan/inf at step {step}",
            save=False,
        )
        self.on_train_end(trainer.args, trainer.state, trainer.control)

    def _skipped_step(self, step: int, gnorm: float) -> bool:
        """The loss scaler skipped this step's update (fp16 gradients overflowed; the scale is lowered
        and the weights are unchanged): an info alert the first time; True (a NaN, by the NaN rule) once
        SKIPPED_STEPS_LIMIT logging steps in a row were skipped."""
        self.skipped_in_a_row += 1
        if not self.told_skipped:
            self.told_skipped = True
            self.emit(
                "alert",
                level="info",
                code="loss_scale_overflow",
                message=f"gradient norm {gnorm} at step {step}: the fp16 loss scaler skipped the update and "
                "lowered its scale (the weights are unchanged; usual in the first steps)",
                remedies=["nothing, if it stops after a few steps", "bf16 (no loss scaling) where the GPU has it"],
                policy="warn",
            )
        return self.skipped_in_a_row >= SKIPPED_STEPS_LIMIT

    def _flags(self) -> tuple[bool, bool]:
        """(stop, save) requested, agreed across ranks. Rank 0 reads the run dir's requests (two
        ``stat`` calls; "kill" is the supervisor's: no checkpoint, terminate now); the others learn
        them from the all-reduce, on a host-side group (``control_group``)."""
        stop = self.rank == 0 and self.run.pending("stop")
        save = self.rank == 0 and self.run.pending("save")
        dist = distributed()
        if dist is not None and self.world_size > 1:
            if self._control_group is _UNSET:
                self._control_group = control_group(dist)
            stop, save = agreed_flags(dist, [stop, save], self._control_group)
        return stop, save

    def _gather_memory(self) -> dict[str, Any]:
        """Every rank's allocator figures (``rank_memory_stats``, peak since the previous logging
        step) and where it runs, gathered to every rank with one all_gather_object: ranks on other
        nodes share no filesystem with rank 0. Rank -> figures (string keys, as in the event)."""
        mine = rank_memory_stats(tracker=self.tracker, reset_peak=True)
        mine.update(node_rank=self.node_rank, local_rank=self.local_rank, host=self.host)
        if mine["source"] == "torch.cuda":  # the torch telemetry backend: the supervisor shows it without amdsmi/NVML
            from cockpit.telemetry import torch_device_memory

            mine["device"] = torch_device_memory()
        dist = distributed()
        if dist is None or self.world_size <= 1:
            return {str(self.rank): mine}
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, (self.rank, mine))
        return {str(r): m for r, m in sorted(e for e in everyone if e is not None)}

    def _check_memory(self, args: TrainingArguments, step: int, mems: dict[str, Any]) -> None:
        """Rank 0: the memory-pressure alert (once), from every rank's figures."""
        import torch

        alert = self.pressure.observe(
            step,
            mems,
            args.per_device_train_batch_size,
            args.gradient_accumulation_steps,
            rocm=getattr(torch.version, "hip", None) is not None,
        )
        if alert:
            self.emit("alert", **alert)

    def _check_step_health(self, step: int, mfu: float | None, grad_norm: Any) -> None:
        """Rank 0: the slow-step (MFU on a GPU) and early gradient-norm alerts, once each (``telemetry/step_health``)."""
        peak = self.meter.peak if self.meter is not None else None
        for alert in (
            self.slow_step.observe(step, mfu, peak.source if peak else "", peak.device if peak else ""),
            self.early_norm.observe(step, grad_norm),
        ):
            if alert:
                self.emit("alert", **alert)

    def _start_tracker(self, model: Any) -> None:
        """cpu_memory_tracker: count live tensor bytes (``plan/measure.py``) as the CPU's allocator."""
        import torch

        if not self.cfg.cpu_memory_tracker or torch.cuda.is_available() or model is None:
            return
        from cockpit.plan.measure import live_tensor_bytes

        self.tracker = live_tensor_bytes()
        self.tracker.__enter__()
        self.tracker.track_existing(list(model.parameters()) + list(model.buffers()))
        self.tracker.reset_peak()

    def _interval_tokens_per_s(self, now: float, tokens: int) -> float | None:
        """Tokens/s since the previous step event, the warm-up steps left out."""
        if not tokens or self.warm_mark is None:
            return None
        t0, k0 = self.last_t or now, self.last_tokens
        if t0 < self.warm_mark[0]:  # this interval began inside the warm-up: measure from its end
            t0, k0 = self.warm_mark
        if now - t0 < 1e-6:
            return None
        return (tokens - k0) / (now - t0)

    def steady_tokens_per_s(self) -> float | None:
        """Tokens/s from the end of warm-up to the last step (the summary's figure); None when
        the run ended within its warm-up."""
        if self.warm_mark is None or self.end_mark is None or self.end_mark[0] <= self.warm_mark[0]:
            return None
        return (self.end_mark[1] - self.warm_mark[1]) / (self.end_mark[0] - self.warm_mark[0])

    def _start_meter(self, args: TrainingArguments, model: Any) -> dict[str, Any]:
        """Rank 0: the FLOPs meter of the model it trains and this device's peak (``flops_meter``);
        ``train_begin``'s ``flops`` field."""
        if self.writer is None or model is None:
            return {}
        from cockpit.train.flops_meter import FlopsMeter, device_peak_here

        peak = device_peak_here(self.cfg, bool(getattr(args, "use_cpu", False)))
        self.meter = FlopsMeter.for_model(model, self.cfg, peak, self.world_size)
        return {"flops": self.meter.describe(float(self.cfg.cutoff_len or 0))}

    def throughput_fields(self, tokens_per_s: float | None, samples_per_s: float, seq_len: float) -> dict[str, Any]:
        """The step event's per-device tokens/s, samples/s, model TFLOPS and MFU (rank 0)."""
        return self.meter.figures(tokens_per_s, samples_per_s, seq_len) if self.meter is not None else {}

    # -- Trainer hooks ----------------------------------------------------------------------
    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        train_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        if self.cfg.use_unsloth_gc and args.gradient_checkpointing and model is not None:
            from cockpit.train.variants import offload_checkpoints

            wrapped = offload_checkpoints(model)  # after the Trainer turned checkpointing on
            if self.rank == 0:
                print(
                    f"use_unsloth_gc: {wrapped} checkpointed modules keep their saved inputs in host memory", flush=True
                )
        self._start_tracker(model)
        self.last_t = time.time()
        self._first_step_began = False
        self.last_step = self._start_step = state.global_step
        self.last_tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        self.warmup_steps = warmup_steps_for(max(state.max_steps - state.global_step, 0))
        self.warm_mark = None
        try:
            batches = len(train_dataloader) if train_dataloader is not None else None
        except TypeError:  # an iterable dataset: no length
            batches = None
        per_epoch = steps_per_epoch(batches, args.gradient_accumulation_steps)
        self.global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * self.world_size
        flops = self._start_meter(args, model)
        self.emit(
            "train_begin",
            total_steps=state.max_steps,
            epochs=planned_epochs(state.max_steps, per_epoch, args.num_train_epochs),
            steps_per_epoch=per_epoch,
            num_train_epochs=args.num_train_epochs,
            world_size=self.world_size,
            global_batch=self.global_batch,
            start_step=state.global_step,
            **flops,
        )

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """The first step's interval starts here, not at ``on_train_begin``: the probes and held-out
        measures before training run between the two (minutes on a CPU), and samples/s counted them."""
        if state.global_step == self.last_step == self._start_step and not self._first_step_began:
            self._first_step_began = True
            self.last_t = time.time()
            self.emit("activity", text=f"first step running ({state.global_step + 1}/{state.max_steps})")
        return control

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        node_telemetry.note_step(state.global_step)
        mark = (time.time(), int(getattr(state, "num_input_tokens_seen", 0) or 0))
        if self.warm_mark is None and state.global_step - self._start_step >= self.warmup_steps:
            self.warm_mark, self.warm_step = mark, state.global_step
        self.end_mark = mark
        self.tokens_total = mark[1]  # the summary's count reaches the last step, not the last logging step
        if state.global_step >= state.max_steps:  # every rank agrees (on_log gathers): the same max_steps
            control.should_log = True  # the run's last loss is its last step's, whatever logging_steps says
        stop, save = self._flags()
        if save:
            control.should_save = True
            if self.rank == 0:
                self.run.consume("save")
        if stop:  # agreed across ranks (_flags)
            control.should_save = True
            control.should_training_stop = True
            control.should_log = True  # the last step's loss, as at the end
            self.stop_reason = self.stop_reason or "stop requested"
            self.stop_requested = True
            if self.rank == 0:
                self.run.consume("stop")
        self._say_between_logs(state, control)
        return control

    def _say_between_logs(self, state: TrainerState, control: TrainerControl) -> None:
        """Rank 0: an ``activity`` event for a step that logs nothing: its checkpoint's save, or the step
        itself while no loss is logged yet in this attempt (``logging_steps`` above 1: the readers' step
        count would sit at the start for minutes). A logged step says it in ``on_log``."""
        if control.should_log:
            return
        if control.should_evaluate or control.should_save:
            self._say_after_log(state, control)
        elif self.last_step == self._start_step:
            self.emit("activity", text=f"step {state.global_step}/{state.max_steps} trained (no loss logged yet)")

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> TrainerControl:
        logs = logs or {}
        if "loss" not in logs:
            if "eval_loss" in logs:
                accuracy = {"eval_accuracy": logs["eval_accuracy"]} if "eval_accuracy" in logs else {}
                self.emit("eval", step=state.global_step, eval_loss=logs["eval_loss"], **accuracy)
            return control
        mems = self._gather_memory()
        loss = float(logs["loss"])
        now = time.time()
        tokens = int(getattr(state, "num_input_tokens_seen", 0) or 0)
        dt = max(now - (self.last_t or now), 1e-9)
        dsteps = max(state.global_step - self.last_step, 1)
        warming = self.warm_mark is None or state.global_step <= self.warm_step
        tps = None if warming else self._interval_tokens_per_s(now, tokens)
        samples = dsteps * args.per_device_train_batch_size * args.gradient_accumulation_steps * self.world_size
        sps = samples / dt
        seq_len = (tokens - self.last_tokens) / samples if tokens > self.last_tokens else self.cfg.cutoff_len
        self.last_t, self.last_step, self.last_tokens = now, state.global_step, tokens
        self.tokens_total = tokens
        if self.first_loss is None and math.isfinite(loss):
            self.first_loss, self.first_loss_step = loss, state.global_step
        self.last_loss, self.last_loss_step = loss, state.global_step
        if self.writer is not None:
            figures = self.throughput_fields(tps, sps, float(seq_len))
            self.emit(
                "step",
                step=state.global_step,
                total_steps=state.max_steps,
                epoch=round(float(logs.get("epoch", state.epoch or 0.0)), 4),
                loss=loss,
                lr=logs.get("learning_rate"),
                grad_norm=logs.get("grad_norm"),
                tokens_per_s=round(tps, 2) if tps is not None else None,
                warmup=warming,
                samples_per_s=round(sps, 3),
                tokens_seen=tokens,
                **figures,
                mem=mems,
                **self._moe_fields(logs),
            )
            self._check_memory(args, state.global_step, mems)
            self._check_step_health(state.global_step, figures.get("mfu"), logs.get("grad_norm"))
            self._check_expert_load(control, state.global_step)
        # NaN / inf loss (or gradient norm) and spikes (every rank sees the same averaged loss)
        gnorm = logs.get("grad_norm")
        bad_gnorm = isinstance(gnorm, float) and not math.isfinite(gnorm)
        if bad_gnorm and isinstance(gnorm, float) and math.isfinite(loss) and self.update_skipped():
            bad_gnorm = self._skipped_step(state.global_step, gnorm)
        else:
            self.skipped_in_a_row = 0
        if not math.isfinite(loss) or bad_gnorm:
            self.nan_seen = True
            what = f"loss is {loss}" if not math.isfinite(loss) else f"gradient norm is {gnorm}"
            self.alert(
                control,
                level="error",
                code="nan_loss",
                message=f"{what} at step {state.global_step}",
                remedies=["lower learning_rate", "use bf16 instead of fp16", "check max_grad_norm (gradient clipping)"],
                policy=self.cfg.nan_policy,
                stop_reason=f"{what.replace(' is ', ' became ')} at step {state.global_step}",
                save=False,
            )
            self.nan_step = self.nan_step or state.global_step
        elif (med := self._spike_median(loss)) is not None:
            self.alert(
                control,
                level="warn",
                code="loss_spike",
                message=f"loss {loss:.4g} at step {state.global_step} is {loss / med:.1f}x the recent median {med:.4g}",
                remedies=["lower learning_rate", "add warmup", "check the data around this step"],
                policy=self.cfg.spike_policy,
                stop_reason=f"loss spike at step {state.global_step} ({loss:.4g}, {loss / med:.1f}x the recent median)",
            )
        if math.isfinite(loss):
            self.recent.append(loss)
        self._say_after_log(state, control)
        return control

    def _moe_fields(self, logs: dict[str, float]) -> dict[str, Any]:
        """An MoE model's step-event fields: ``aux_loss`` (the router's loss, mean since the last log) and
        ``expert_load`` (:mod:`cockpit.store.expert_load`); none for a dense model."""
        out: dict[str, Any] = {}
        if logs.get("aux_loss") is not None:
            out["aux_loss"] = logs["aux_loss"]
        watch = self.router_watch
        if watch is not None and watch.last_counts:
            out["expert_load"] = encode(watch.last_counts, watch.layers, watch.top_k)
        return out

    def _check_expert_load(self, control: TrainerControl, step: int) -> None:
        """Rank 0: an alert when an expert stays nearly unused or overloaded (cockpit.store.expert_load)."""
        watch = self.router_watch
        if watch is None or not watch.last_counts:
            return
        for found in self.load_watch.observe(watch.last_counts, watch.layers, step):
            self.emit("alert", policy="warn", **found)

    def _spike_median(self, loss: float) -> float | None:
        """The recent losses' median when ``loss`` is a spike over it (``spike_factor`` times), else None.
        Only over a positive median: a preference or policy loss (DPO's, GRPO's) sits near or below zero,
        where "3x the median" is no spike (GRPO's first steps log exactly 0: the ratio was a division by zero)."""
        if len(self.recent) < 5:
            return None
        med = statistics.median(self.recent)
        return med if med > 0 and loss > self.cfg.spike_factor * med else None

    def _say_after_log(self, state: TrainerState, control: TrainerControl) -> None:
        """Rank 0: what HF does right after this step's log: evaluate, then save."""
        if control.should_evaluate:
            self.emit("activity", text=f"evaluating at step {state.global_step}")
        elif control.should_save:
            self.emit("activity", text=f"saving checkpoint-{state.global_step}")

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.tracker is not None:
            self.tracker.__exit__(None, None, None)
            self.tracker = None
        node_telemetry.note_train_end()
        self.emit("train_end", step=state.global_step)  # the watchdog's load timeout again (save, probes)
        return control

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        from cockpit.train.trainer import checkpoint_record

        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        self.emit(
            "checkpoint_saved",
            step=state.global_step,
            path=path,
            loss_finite=checkpoint_record(path).get("loss_finite", True),
        )
        return control


def scaler_skipped(optimizer: Any) -> bool:
    """Whether the loss scaler skipped the last update (accelerate's optimizer wrappers: torch's
    GradScaler, DeepSpeed's fp16 scaler; False without one, or where the flag's state is missing)."""
    return bool(getattr(optimizer, "step_was_skipped", False))
