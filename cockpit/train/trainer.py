"""HF Trainer with atomic checkpoints.

The stock Trainer writes ``checkpoint-N`` in place, so a crash (or a full disk) in the middle
of a save leaves a folder that looks like a checkpoint. Here every checkpoint is written under
``<output_dir>/.staging/`` and renamed into place only when complete; ``last_checkpoint()``
never looks in ``.staging``. A failed save removes its staging folder and raises
:class:`CheckpointError` with a clear reason; older checkpoints are untouched.

Each checkpoint also holds ``cockpit_checkpoint.json`` (:data:`RECORD`), written before the
rename: whether the training loss (and gradient norm) up to it was finite on every rank, and
the run's totals so far (training seconds, first loss, tokens seen) so a resumed run's summary
covers the whole run. ``resume`` and ``export`` never pick a checkpoint whose loss was not finite.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
from collections.abc import Callable
from typing import Any

from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, sort_checkpoints

from cockpit.store.rundir import CHECKPOINT_STAGING
from cockpit.train.badam_state import restore_block, save_block
from cockpit.train.callbacks import scaler_skipped
from cockpit.train.chunked_loss import base_model, lm_loss_without_logits, plain_lm_head
from cockpit.train.host_facts import BOUNDS, TOKENS, WithHostFacts
from cockpit.train.labelled_logits import (
    POSITIONS,
    WithLabelledPositions,
    accepts_logits_to_keep,
    labelled_positions_only,
)
from cockpit.train.packed_attention import prime_bounds
from cockpit.train.token_weights import weighted_causal_lm_loss, weighted_model_loss

RECORD = "cockpit_checkpoint.json"


def checkpoint_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint's record ({} for one saved before records existed)."""
    try:
        record: dict[str, Any] = json.loads(open(os.path.join(path, RECORD), encoding="utf-8").read())
        return record
    except (OSError, ValueError):
        return {}


def _finite(value: Any) -> bool:
    if value is None:
        return True
    if hasattr(value, "detach"):
        import torch

        return bool(torch.isfinite(value.detach()).all().item())
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


def _all_ranks_agree(flag: bool) -> bool:
    """True only when ``flag`` is True on every rank."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return flag
    device = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item() > 0.5)


class CheckpointError(RuntimeError):
    pass


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _disk_full(exc: BaseException, folder: str) -> bool:
    """ENOSPC anywhere in the chain, or (torch's zip writer hides errno) almost no space left."""
    e: BaseException | None = exc
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return True
        e = e.__cause__ or e.__context__
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return False
    return usage.free < max(16 * 2**20, usage.total // 100)


def unstage_best_in_state_file(checkpoint: str, final_root: str) -> None:
    """The checkpoint's ``trainer_state.json`` names the best checkpoint where it is now, not in
    ``.staging`` where HF saw it (a resume drops a best checkpoint whose folder is gone)."""
    path = os.path.join(checkpoint, TRAINER_STATE_NAME)
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except (OSError, ValueError):
        return
    best = state.get("best_model_checkpoint")
    staged_root = os.path.join(final_root, CHECKPOINT_STAGING)
    if best and best.startswith(staged_root):
        state["best_model_checkpoint"] = best.replace(staged_root, final_root, 1)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=2, sort_keys=True)
        os.replace(tmp, path)


def retire_old_checkpoints(output_dir: str, limit: int | None, best: str | None) -> None:
    """HF's ``rotate_checkpoints`` rule (keep ``limit``, always the newest and the best), but each old
    checkpoint is first renamed into ``.staging/`` (atomic) and deleted there: a rank killed while
    deleting leaves no half checkpoint among the complete ones (the supervisor clears ``.staging``)."""
    if not limit or limit <= 0:
        return
    checkpoints = sort_checkpoints(output_dir, PREFIX_CHECKPOINT_DIR)
    protected = {checkpoints[-1]} if checkpoints else set()
    if best is not None:
        protected.add(str(best))
    remaining = len(checkpoints)
    for checkpoint in checkpoints:
        if remaining <= max(limit, len(protected)):
            break
        if checkpoint in protected:
            continue
        trash = os.path.join(output_dir, CHECKPOINT_STAGING, f"retired-{os.path.basename(checkpoint)}")
        os.makedirs(os.path.dirname(trash), exist_ok=True)
        shutil.rmtree(trash, ignore_errors=True)
        os.replace(checkpoint, trash)
        shutil.rmtree(trash, ignore_errors=True)
        remaining -= 1
    try:
        os.rmdir(os.path.join(output_dir, CHECKPOINT_STAGING))  # leave no empty .staging behind
    except OSError:
        pass


def finite_step(loss: Any, grad_norm: Any, optimizer: Any) -> bool:
    """Whether the weights after this step are finite: a finite loss, and a finite gradient norm or an
    update the fp16 loss scaler skipped for it (the weights then unchanged)."""
    return _finite(loss) and (_finite(grad_norm) or scaler_skipped(optimizer))


class CockpitTrainer(Trainer):  # type: ignore[misc]  # Trainer is Any here (follow_imports = skip)
    _staging = False
    loss_finite = True  # this rank's training loss and gradient norm, every step so far
    run_totals: Callable[[], dict[str, Any]] | None = None  # the worker's: first_loss, train_time_s, ...
    _labelled_logits: bool | None = None  # decided at the first training step
    _host_tokens: int | None = None  # the last training batch's tokens, counted on the host (host_facts)
    _host_bounds: list[int] | None = None  # its packed samples' bounds (host_facts)
    chunked_loss = True  # training's LM loss chunk by chunk, never the full logits (False: the model's own)
    _chunked_head: Any = None  # the lm_head the chunked loss reads, decided at the first training step
    chunked_loss_why_not = ""  # why the chunked loss does not apply (empty: it does, or not decided yet)
    eval_data_collator: Any = None  # evaluation's own collator (None: the training one)
    # use_dft_loss / use_eaft_loss: each token's loss weighted (cockpit.train.token_weights), training and evaluation
    token_weighting: Callable[[Any, Any], Any] | None = None
    router_watch: Any = None  # an MoE model's RouterWatch (cockpit.train.moe); None for a dense model

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self.optimizer).__name__ == "BlockOptimizerRatio":
            # BAdam's ratio mode leaves sparse gradients, which torch's foreach clip_grad_norm_ cannot
            # take; BAdam's own clipping (torch 1.13's loop) can, as LLaMA-Factory's trainer patches it
            from types import MethodType

            from badam import clip_grad_norm_old_version

            self.accelerator.clip_grad_norm_ = MethodType(clip_grad_norm_old_version, self.accelerator)
        # an MoE model: its router loss and expert load, summed between logging steps (cockpit.train.moe)
        from cockpit.train.moe import RouterWatch

        self.router_watch = RouterWatch.attach(self.model)
        for callback in self.callback_handler.callbacks:
            if hasattr(callback, "router_watch"):
                callback.router_watch = self.router_watch

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        # a training log (every rank): the MoE model's mean router loss since the last one, beside the loss
        # (a TRL trainer that logs its own aux_loss keeps it)
        if self.router_watch is not None and "loss" in logs:
            self.router_watch.take(int(self.args.world_size))
            if self.router_watch.last_aux is not None and "aux_loss" not in logs:
                logs["aux_loss"] = round(self.router_watch.last_aux, 6)
        super().log(logs, *args, **kwargs)

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        # resumed from a checkpoint at max_steps: nothing is left to train. HF's epoch loop checks
        # max_steps only after a step, so it would train one step past it (tests/test_nan_resume.py)
        if 0 < self.state.max_steps <= self.state.global_step:
            self.control.should_training_stop = True
            return None
        return super()._run_epoch(*args, **kwargs)  # transformers 5's epoch loop

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        # compute_accuracy averages per row: its evaluation batches keep one sample per row
        if self.eval_data_collator is None:
            metrics: dict[str, float] = super().evaluate(*args, **kwargs)
            return metrics
        trainer: Any = self  # HF's Trainer types data_collator loosely
        train_collator, trainer.data_collator = trainer.data_collator, self.eval_data_collator
        try:
            metrics = super().evaluate(*args, **kwargs)
            return metrics
        finally:
            trainer.data_collator = train_collator

    def get_train_dataloader(self) -> Any:
        # the training batches carry what the step needs as host numbers (tokens, sample bounds) and their
        # labelled positions, found on the host by the collator
        trainer: Any = self
        how = self.args.include_num_input_tokens_seen
        collate: Any = WithHostFacts(
            trainer.data_collator,
            "all" if how is True else str(how),
            getattr(self.processing_class, "pad_token_id", None),
        )
        if self._labelled_logits_only():
            collate = WithLabelledPositions(collate)
        plain, trainer.data_collator = trainer.data_collator, collate
        try:
            return super().get_train_dataloader()
        finally:
            trainer.data_collator = plain

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        # the batch's facts the collator found on the host (cockpit.train.host_facts): out of the batch before
        # the model sees it; the tokens kept for _track_num_input_tokens (HF calls it after the step with this
        # same dict), the sample bounds for compute_loss, where the batch is on its device
        if not isinstance(inputs, list):  # GRPO's batch is its rows, a list: no facts in it
            self._host_tokens = inputs.pop(TOKENS, None)
            self._host_bounds = inputs.pop(BOUNDS, None)
        return super().training_step(model, inputs, *args, **kwargs)

    def _track_num_input_tokens(self, inputs: Any) -> Any:
        # one rank: the collator's host count, no device read; several: HF's gather of every rank's count
        tokens, self._host_tokens = self._host_tokens, None
        if tokens is None or self.args.world_size > 1:
            return super()._track_num_input_tokens(inputs)
        self.state.num_input_tokens_seen += tokens
        return None

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        # training: the LM head only where a label is (cockpit.train.labelled_logits); evaluation
        # and prediction keep every logit (accuracy, generated predictions read them)
        positions = inputs.pop(POSITIONS, None)
        bounds, self._host_bounds = self._host_bounds, None
        if bounds is not None:  # the per-sample attention reads them from the host, not the device tensor
            prime_bounds(inputs.get("cu_seq_lens_q"), bounds)
        if not return_outputs and model.training and self._labelled_logits_only():
            inputs = labelled_positions_only(inputs, positions)
            head, unwrapped = self._chunked_loss_head(), self.accelerator.unwrap_model(model)
            if head is not None and "labels" in inputs and base_model(unwrapped).lm_head is head:
                # the model's forward hands its hidden states to the chunked loss (cockpit.train.chunked_loss)
                with lm_loss_without_logits(unwrapped, head, weighting=self.token_weighting):
                    return super().compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        if self.token_weighting is not None and "labels" in inputs:
            # the weighted loss over the full logits, as the model's own loss function
            base = base_model(self.accelerator.unwrap_model(model))
            with weighted_model_loss(base, weighted_causal_lm_loss(self.token_weighting)):
                return super().compute_loss(
                    model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
                )
        return super().compute_loss(model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch)

    def _chunked_loss_head(self) -> Any:
        """The lm_head the chunked loss reads, when it gives the model's own loss exactly: HF's
        compute_loss (not a TRL trainer's), one process per device, the whole head on every rank,
        and a model that goes straight from a plain lm_head to HF's causal-LM loss."""
        if self._chunked_head is None:
            head, why = None, self._chunked_loss_off()
            if not why:
                head, why = plain_lm_head(self.accelerator.unwrap_model(self.model))
            self._chunked_head, self.chunked_loss_why_not = head or False, why
        return self._chunked_head or None

    def _chunked_loss_off(self) -> str:
        """Why this trainer keeps the model's own loss ("" when nothing here stops the chunked one);
        the label smoother, a custom loss and Liger already keep the full logits (_labelled_logits_only)."""
        if not self.chunked_loss:
            return "turned off (CockpitTrainer.chunked_loss)"
        owner = next(
            c for c in type(self).__mro__[type(self).__mro__.index(CockpitTrainer) + 1 :] if "compute_loss" in vars(c)
        )
        if owner is not Trainer:
            return f"{owner.__name__} computes its own loss"
        pc = getattr(self.accelerator, "parallelism_config", None)
        if pc is not None and any(getattr(pc, f"{k}_enabled", False) for k in ("sp", "cp", "tp")):
            return "sequence, context or tensor parallel"
        if self.args.n_gpu > 1 or self.is_fsdp_enabled or getattr(self.args, "torch_compile", False):
            return "DataParallel, FSDP or torch.compile"
        return ""

    def _labelled_logits_only(self) -> bool:
        """The model's own loss on fewer logits: not with a label smoother or a custom loss (they
        read the full logits) nor Liger's kernels (their fused loss never builds logits)."""
        if self._labelled_logits is None:
            self._labelled_logits = (
                self.label_smoother is None
                and self.compute_loss_func is None
                and not getattr(self.args, "use_liger_kernel", False)
                and accepts_logits_to_keep(self.model)
            )
        return self._labelled_logits

    def _maybe_log_save_evaluate(self, tr_loss: Any, grad_norm: Any, *args: Any, **kwargs: Any) -> Any:
        # tr_loss sums the loss since the last log (a NaN in it stays until then): looking at
        # logging and saving steps sees every step, without a device sync on the others
        if self.loss_finite and (self.control.should_log or self.control.should_save):
            self.loss_finite = finite_step(tr_loss, grad_norm, self.optimizer)
        return super()._maybe_log_save_evaluate(tr_loss, grad_norm, *args, **kwargs)

    def _write_record(self, folder: str) -> None:
        record = {"step": self.state.global_step, "loss_finite": self.loss_finite}
        if self.run_totals is not None:
            record.update(self.run_totals())
        with open(os.path.join(folder, RECORD), "w", encoding="utf-8") as fh:
            json.dump(record, fh, indent=1)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        super()._save_optimizer_and_scheduler(output_dir)
        if self.args.should_save:
            save_block(self.optimizer, output_dir)  # BAdam's block, when it is BAdam

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint:
            restore_block(self.optimizer, checkpoint, log=print)  # before the block's moments load
        super()._load_optimizer_and_scheduler(checkpoint)

    def _get_output_dir(self, trial: Any) -> str:
        root: str = super()._get_output_dir(trial)
        return os.path.join(root, CHECKPOINT_STAGING) if self._staging else root

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        final_root = super()._get_output_dir(trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staged = os.path.join(final_root, CHECKPOINT_STAGING, name)
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # rotate after the rename
        if self.args.should_save and os.path.isdir(staged):  # left by a save that was killed
            shutil.rmtree(staged, ignore_errors=True)
        self._staging = True
        self.loss_finite = _all_ranks_agree(self.loss_finite)
        try:
            super()._save_checkpoint(model, trial)
            if self.args.should_save:
                self._write_record(staged)
        except Exception as exc:  # torch.save reports ENOSPC as "RuntimeError: unexpected pos"
            full = _disk_full(exc, final_root)
            shutil.rmtree(staged, ignore_errors=True)
            if full:
                raise CheckpointError(
                    f"disk full while saving {name} in {final_root}; older checkpoints are intact; "
                    "free space, use another output_dir, or set save_total_limit"
                ) from exc
            raise CheckpointError(f"saving {name} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._staging = False
            self.args.save_total_limit = limit
        _barrier()
        # HF named the best checkpoint while it was staged: the same checkpoint is in place now (every
        # rank's state; else load_best_model_at_end finds no folder there and quietly loads nothing)
        best = self.state.best_model_checkpoint
        if best:
            best = best.replace(os.path.join(final_root, CHECKPOINT_STAGING), final_root)
            self.state.best_model_checkpoint = best
        if self.args.should_save:
            target = os.path.join(final_root, name)
            if os.path.exists(target):  # a re-save of the same step (e.g. save-now at a save step)
                shutil.rmtree(target)
            os.replace(staged, target)
            try:
                os.rmdir(os.path.dirname(staged))  # leave no empty .staging behind
            except OSError:
                pass
            unstage_best_in_state_file(target, final_root)  # a resume reads it back
            retire_old_checkpoints(final_root, limit, best)
        _barrier()
