"""What a rank trains with: where (CPU or GPU), in which precision, into which folders, and the
run config as Hugging Face ``TrainingArguments`` (the one place it becomes them; TRL's stage
configs start from these, :func:`cockpit.train.recipes.base.stage_arguments`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.store.rundir import RunDir

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from cockpit.config.run_config import RunConfig
    from cockpit.store.events import EventWriter


def artefact_dirs(run: RunDir, cfg: RunConfig) -> dict[str, Path]:
    out = Path(cfg.output_dir) if cfg.output_dir else run.path
    return {
        "out": out,
        "checkpoints": out / "checkpoints",
        "adapter": out / "adapter",
        "plot": out / "loss.png",
        "trackers": run.path / "trackers",  # in the run dir whatever output_dir says: cockpit rm removes them
    }


def rank_precision(
    cfg: RunConfig, use_cpu: bool, writer: EventWriter | None, log: Callable[[str], object]
) -> RunConfig:
    """The config this rank trains with: ``fp16`` on the CPU trains in fp32
    (:func:`cockpit.device.cpu_precision`), said in the log and as a warn alert."""
    from cockpit.device import CPU, GPU, cpu_precision

    precise, note = cpu_precision({"fp16": cfg.fp16}, CPU if use_cpu else GPU)
    if note:
        log(note)
        if writer:
            writer.emit(
                "alert",
                level="warn",
                code="fp16_on_cpu",
                message=note,
                remedies=["bf16: true (the CPU's mixed precision)", "fp16 applies on a GPU"],
            )
    return cfg.replace(fp16=bool(precise["fp16"])) if note else cfg


def trains_on_cpu(cfg: RunConfig) -> bool:
    """:func:`cockpit.device.resolve_device` with torch's GPU count: a config that needs GPUs
    raises (exit 2) where none is visible instead of training on the CPU."""
    import torch

    from cockpit.device import CPU, resolve_device

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return resolve_device(cfg.use_cpu, cfg.quantization_bit, gpus) == CPU


class ListDataset:
    """A torch-style map dataset over rendered samples."""

    def __init__(self, rows: list[dict[str, list[int]]]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.rows[i]


# run config keys that are TrainingArguments of the same name and meaning
SAME_NAME_ARGUMENTS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "lr_scheduler_type",
    "weight_decay",
    "max_grad_norm",
    "bf16",
    "fp16",
    "gradient_checkpointing",
    "logging_steps",
    "save_strategy",
    "save_steps",
    "save_total_limit",
    "save_only_model",
    "seed",
    "ddp_timeout",
    "dataloader_num_workers",
)


def warmup_fraction(warmup_ratio: float) -> float:
    """warmup_ratio as HF's warmup_steps reads it: a value >= 1 there is a step count, so a ratio of 1.0
    (the whole run warms up) goes as the largest float below 1 (ceil(steps x it) is every step)."""
    return math.nextafter(1.0, 0.0) if warmup_ratio >= 1.0 else float(warmup_ratio)


def training_arguments(cfg: RunConfig, dirs: dict[str, Path], use_cpu: bool, world_size: int) -> TrainingArguments:
    from transformers import TrainingArguments

    from cockpit.train.trackers import report_to

    warmup = cfg.warmup_steps if cfg.warmup_steps > 0 else warmup_fraction(cfg.warmup_ratio)
    trackers_dir = dirs.get("trackers") or dirs["checkpoints"].parent / "trackers"
    kwargs: dict[str, Any] = {key: getattr(cfg, key) for key in SAME_NAME_ARGUMENTS}
    if cfg.pure_bf16:  # the model is bf16 itself (cockpit.train.model.base_load_kwargs): no autocast
        kwargs["bf16"] = False
    kwargs.update(
        output_dir=str(dirs["checkpoints"]),
        warmup_steps=warmup,
        gradient_checkpointing_kwargs={"use_reentrant": False} if cfg.gradient_checkpointing else None,
        logging_strategy="steps",
        logging_first_step=True,
        data_seed=cfg.seed,
        report_to=report_to(cfg, trackers_dir),  # HF's tracker callbacks; their files under RUN_DIR/trackers
        run_name=trackers_dir.parent.name,  # the run id, the trackers' name for the run
        project=cfg.project,  # trackio's project
        use_cpu=use_cpu,
        remove_unused_columns=False,
        logging_nan_inf_filter=False,  # the default hides NaN/inf losses behind an average
        disable_tqdm=True,
        log_level="warning",
    )
    from cockpit.data.packing import batching_arguments
    from cockpit.train.kernels import kernel_arguments

    kwargs.update(batching_arguments(cfg))  # token counting, length grouping
    kwargs.update(kernel_arguments(cfg, use_cpu))  # enable_liger_kernel, torch_compile (or a refusal)
    if world_size > 1 and use_cpu:
        kwargs["ddp_backend"] = "gloo"
    if cfg.deepspeed:
        kwargs["deepspeed"] = cfg.deepspeed  # a path, or the config dict set up in apply_strategy
        if use_cpu:
            from cockpit.train.distributed import skip_deepspeed_shm_build

            skip_deepspeed_shm_build()  # before TrainingArguments start DeepSpeed's comm backend
    from cockpit.train.variants import training_kwargs

    kwargs.update(training_kwargs(cfg))  # optim, Adam betas/eps, schedule kwargs, checkpointing, eval
    return TrainingArguments(**kwargs)
