"""A training rank: ``python -m cockpit.train.worker RUN_DIR`` (under torchrun for several).

HF Trainer + PEFT on the resolved config in ``RUN_DIR/config.yaml``. Rank 0 writes the step,
probe, checkpoint and final events and ``summary.json``; every rank obeys stop/save requests
through :class:`CockpitCallback`. Never imports textual.

Exit codes: 0 finished or stopped on request, 1 training failed, 2 invalid input.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

from cockpit.errors import InputError
from cockpit.run.events import EventWriter, read_all
from cockpit.run.rundir import RunDir, atomic_write_json

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2


OOM_REMEDIES = [
    "lower per_device_train_batch_size and raise gradient_accumulation_steps (same global batch)",
    "gradient_checkpointing: true",
    "a shorter cutoff_len",
    "ZeRO-3 / FSDP across more devices, or QLoRA (quantization_bit: 4)",
    "cockpit plan CONFIG tells what fits before launch",
]
_OOM_TEXT = ("out of memory", "can't allocate memory", "cannot allocate memory", "hip out of memory", "cuda out of memory")


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return any(t in str(exc).lower() for t in _OOM_TEXT)


def dist_env() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def load_run_config(run: RunDir) -> dict[str, Any]:
    return yaml.safe_load(run.config_path.read_text(encoding="utf-8"))


def artefact_dirs(run: RunDir, cfg: dict[str, Any]) -> dict[str, Path]:
    out = Path(cfg["output_dir"]) if cfg.get("output_dir") else run.path
    return {"out": out, "checkpoints": out / "checkpoints", "adapter": out / "adapter", "plot": out / "loss.png"}


def rank_precision(cfg: dict[str, Any], use_cpu: bool, writer, log) -> dict[str, Any]:
    """The config this rank trains with: ``fp16`` on the CPU trains in fp32
    (:func:`cockpit.device.cpu_precision`), said in the log and as a warn alert."""
    from cockpit.device import CPU, GPU, cpu_precision

    cfg, note = cpu_precision(cfg, CPU if use_cpu else GPU)
    if note:
        log(note)
        if writer:
            writer.emit("alert", level="warn", code="fp16_on_cpu", message=note, remedies=["bf16: true (the CPU's mixed precision)", "fp16 applies on a GPU"])
    return cfg


def _use_cpu(cfg: dict[str, Any]) -> bool:
    """:func:`cockpit.device.resolve_device` with torch's GPU count: a config that needs GPUs
    raises (exit 2) where none is visible instead of training on the CPU."""
    import torch

    from cockpit.device import CPU, resolve_device

    return resolve_device(cfg, torch.cuda.device_count() if torch.cuda.is_available() else 0) == CPU


def build_model(cfg: dict[str, Any], ref, use_cpu: bool, local_rank: int, load: str = "full"):
    """The model to train: base (+ quantization) + PEFT adapter / freeze / full.

    ``load``: ``full`` (from_pretrained), ``meta`` (parameters on the meta device, for FSDP2's
    sharded load) or ``zero3`` (built partitioned under zero.Init, weights streamed): see
    :mod:`cockpit.train.sharded_load`."""
    import torch
    from transformers import AutoModelForCausalLM, set_seed

    set_seed(cfg["seed"])  # the adapter's random init: the same on every rank (FSDP2 shards each rank's copy) and every run

    kwargs: dict[str, Any] = {"trust_remote_code": bool(cfg["trust_remote_code"]), **ref.kwargs()}
    method = cfg["finetuning_type"]
    if cfg["quantization_bit"]:
        if use_cpu:
            raise InputError("quantization_bit (QLoRA) needs a GPU and bitsandbytes; unset it to train on the CPU")
        from transformers import BitsAndBytesConfig

        compute = torch.bfloat16 if cfg["bf16"] else (torch.float16 if cfg["fp16"] else torch.float32)
        kwargs["quantization_config"] = (
            BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute)
            if cfg["quantization_bit"] == 4
            else BitsAndBytesConfig(load_in_8bit=True)
        )
        kwargs["device_map"] = {"": local_rank}
    # LoRA/freeze on GPU: frozen base weights in the half precision; full FT: fp32 master weights.
    if method == "lora" and not use_cpu and (cfg["bf16"] or cfg["fp16"]):
        kwargs["dtype"] = torch.bfloat16 if cfg["bf16"] else torch.float16
    else:
        kwargs["dtype"] = torch.float32
    from cockpit.train.variants import lora_config_kwargs, model_load_kwargs, upcast

    if load == "full":
        model = AutoModelForCausalLM.from_pretrained(ref.path, **kwargs, **model_load_kwargs(cfg, ref))
    else:
        from cockpit.train.sharded_load import sharded_base

        model = sharded_base(cfg, ref, kwargs["dtype"], load)
    model.config.use_cache = False
    upcast(model, cfg)  # upcast_layernorm / upcast_lmhead_output
    if cfg["quantization_bit"]:
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg["gradient_checkpointing"])
    if method == "lora":
        from peft import LoraConfig, PeftModel, get_peft_model

        if cfg.get("adapter_name_or_path") and not cfg.get("create_new_adapter"):
            model = PeftModel.from_pretrained(model, cfg["adapter_name_or_path"], is_trainable=True)
        else:
            if cfg.get("adapter_name_or_path"):  # create_new_adapter: the old adapter merged into the base, a new one trained
                model = PeftModel.from_pretrained(model, cfg["adapter_name_or_path"]).merge_and_unload()
            set_seed(cfg["seed"])  # the adapter's init depends on the seed only, however the base was loaded
            target = cfg["lora_target"]
            targets: Any = "all-linear" if target == "all" else [t.strip() for t in target.split(",") if t.strip()]
            lcfg = LoraConfig(
                r=cfg["lora_rank"],
                lora_alpha=cfg["lora_alpha"],
                lora_dropout=cfg["lora_dropout"],
                target_modules=targets,
                task_type="CAUSAL_LM",
                **lora_config_kwargs(cfg),  # DoRA, rsLoRA, PiSSA, modules_to_save
            )
            try:
                model = get_peft_model(model, lcfg)
            except ValueError as exc:
                raise InputError(f"lora_target: {exc}") from None
    elif method == "freeze":
        layers = getattr(getattr(model, "model", model), "layers", None)
        if layers is None:
            raise InputError("finetuning_type freeze: cannot find the decoder layers of this model")
        n = cfg["freeze_trainable_layers"]
        chosen = range(len(layers) - n, len(layers)) if n > 0 else range(0, -n)
        for p in model.parameters():
            p.requires_grad_(False)
        from cockpit.train.variants import freeze_module_selected

        for i in chosen:
            for name, p in layers[i].named_parameters():
                p.requires_grad_(freeze_module_selected(name, cfg.get("freeze_trainable_modules")))
        if not any(p.requires_grad for p in model.parameters()):
            raise InputError(f"freeze_trainable_modules: no module named {cfg.get('freeze_trainable_modules')!r} in the trained layers")
    return model


class ListDataset:
    """A torch-style map dataset over rendered samples."""

    def __init__(self, rows: list[dict[str, list[int]]]):
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return self.rows[i]


def training_arguments(cfg: dict[str, Any], dirs: dict[str, Path], use_cpu: bool, world_size: int):
    from transformers import TrainingArguments

    warmup = cfg["warmup_steps"] if cfg["warmup_steps"] > 0 else float(cfg["warmup_ratio"])
    kwargs: dict[str, Any] = dict(
        output_dir=str(dirs["checkpoints"]),
        per_device_train_batch_size=cfg["per_device_train_batch_size"],
        gradient_accumulation_steps=cfg["gradient_accumulation_steps"],
        learning_rate=cfg["learning_rate"],
        num_train_epochs=cfg["num_train_epochs"],
        max_steps=cfg["max_steps"],
        lr_scheduler_type=cfg["lr_scheduler_type"],
        warmup_steps=warmup,
        weight_decay=cfg["weight_decay"],
        max_grad_norm=cfg["max_grad_norm"],
        bf16=cfg["bf16"],
        fp16=cfg["fp16"],
        gradient_checkpointing=cfg["gradient_checkpointing"],
        gradient_checkpointing_kwargs={"use_reentrant": False} if cfg["gradient_checkpointing"] else None,
        logging_strategy="steps",
        logging_steps=cfg["logging_steps"],
        logging_first_step=True,
        save_strategy=cfg["save_strategy"],
        save_steps=cfg["save_steps"],
        save_total_limit=cfg["save_total_limit"],
        save_only_model=cfg["save_only_model"],
        seed=cfg["seed"],
        data_seed=cfg["seed"],
        report_to=[] if cfg["report_to"] == "none" else [cfg["report_to"]],
        ddp_timeout=cfg["ddp_timeout"],
        use_cpu=use_cpu,
        dataloader_num_workers=cfg["dataloader_num_workers"],
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
    if cfg.get("deepspeed"):
        kwargs["deepspeed"] = cfg["deepspeed"]  # a path, or the config dict set up in _apply_strategy
    from cockpit.train.variants import training_kwargs

    kwargs.update(training_kwargs(cfg))  # optim, Adam betas/eps, schedule kwargs, checkpointing, eval
    return TrainingArguments(**kwargs)


def comm_health_probe(writer, use_cpu: bool, log) -> None:
    """All ranks: a timed all-reduce at a few sizes (the process group exists once the
    TrainingArguments are built); rank 0 records backend, version and bus bandwidth."""
    from cockpit.comm.env import comm_env
    from cockpit.comm.health import MB, allreduce_probe, backend_info

    info = backend_info()
    sizes = (1 * MB, 4 * MB, 16 * MB) if use_cpu else (1 * MB, 4 * MB, 16 * MB, 64 * MB)
    probe = allreduce_probe(sizes_bytes=sizes, iters=5)
    best = max((r.get("busbw_gbps") or 0.0 for r in probe.get("results", [])), default=0.0)
    log(f"comm probe: {info.get('library') or info.get('backend')} world {info.get('world_size')}, best bus bandwidth {best:.2f} GB/s")
    if writer is not None:
        writer.emit(
            "comm",
            backend=info.get("library") or info.get("backend"),
            version=info.get("version"),
            world_size=info.get("world_size"),
            status="ok" if probe.get("ok") else "probe failed",
            details={"probe": probe, "info": info, "env": comm_env()},
        )


def last_checkpoint(checkpoints: Path) -> str | None:
    """The newest complete checkpoint (one with trainer_state.json) whose training loss up to it
    was finite (its record says so; older checkpoints without a record count as finite), or None."""
    from cockpit.train.trainer import checkpoint_record

    if not checkpoints.is_dir():
        return None
    good = []
    for d in checkpoints.iterdir():
        if d.is_dir() and d.name.startswith("checkpoint-") and (d / "trainer_state.json").exists():
            if checkpoint_record(d).get("loss_finite") is False:
                continue  # saved after a NaN: poisoned
            try:
                good.append((int(d.name.split("-")[1]), d))
            except ValueError:
                continue
    return str(max(good)[1]) if good else None


def resume_point(cfg: dict[str, Any], dirs: dict[str, Path], writer, log) -> tuple[str | None, dict[str, Any]]:
    """The checkpoint this attempt starts from, and the run's totals saved with it (first loss,
    training seconds). ``resume_from_checkpoint: last`` that finds none says so (a warning event
    and a log line) before starting from scratch."""
    from cockpit.train.trainer import checkpoint_record

    resume = cfg.get("resume_from_checkpoint")
    if resume in ("last", "true", "True", True):
        resume = last_checkpoint(dirs["checkpoints"])
        if resume is None:
            message = f"resume_from_checkpoint: last found no complete checkpoint with a finite loss in {dirs['checkpoints']}; training starts from step 0"
            log(f"warning: {message}")
            if writer is not None:
                writer.emit("alert", level="warn", code="no_checkpoint", message=message, remedies=["check output_dir", "cockpit runs shows where each run saved"])
    if not resume:
        return None, {}
    record = checkpoint_record(resume)
    return str(resume), {k: record[k] for k in ("first_loss", "train_time_s") if record.get(k) is not None}


MODEL_FILES_SKIPPED = ("optimizer", "scheduler", "rng_state", "trainer_state", "training_args", "cockpit_checkpoint", "global_step", "zero_to_fp32", "latest")


def adapter_from_last_good(dirs: dict[str, Path], rank: int, log) -> str | None:
    """After a NaN: the run's adapter is the last checkpoint saved with a finite loss (its model
    files copied to ``adapter/``, atomically), or none. Returns the checkpoint's name."""
    import shutil

    good = last_checkpoint(dirs["checkpoints"])
    if good is None or rank != 0:
        return Path(good).name if good else None
    staging = dirs["adapter"].with_name(f".{dirs['adapter'].name}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for f in Path(good).iterdir():
        if f.is_file() and not f.name.startswith(MODEL_FILES_SKIPPED):
            shutil.copy2(f, staging / f.name)
    shutil.rmtree(dirs["adapter"], ignore_errors=True)
    os.replace(staging, dirs["adapter"])
    log(f"loss was not finite: the adapter is {Path(good).name}'s, the last checkpoint before the NaN")
    return Path(good).name


def loss_series(events: list[dict[str, Any]], kind: str, field: str) -> list[tuple[int, float]]:
    """(step, value) of the finite values of ``field`` in the events of ``kind``."""
    from cockpit.run.events import as_float

    pts = [(e["step"], as_float(e.get(field))) for e in events if e["kind"] == kind]
    return [(s, v) for s, v in pts if v is not None and math.isfinite(v)]


def eval_losses(events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The run's eval losses for summary.json: how many, the first, the last and the best as
    [step, loss]; None without evaluation."""
    pts = loss_series(events, "eval", "eval_loss")
    if not pts:
        return None
    best = min(pts, key=lambda p: p[1])
    return {"count": len(pts), "first": list(pts[0]), "last": list(pts[-1]), "best": list(best)}


def plot_loss(events_path: Path, out: Path, events: list[dict[str, Any]] | None = None) -> bool:
    """loss.png from the event log (``events``: the log already read)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = read_all(events_path) if events is None else events
    pts = loss_series(events, "step", "loss")
    if not pts:
        return False
    evals = loss_series(events, "eval", "eval_loss")  # do_eval / val_size / eval_dataset: a second line
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", linewidth=1, label="training loss")
    if evals:
        ax.plot([p[0] for p in evals], [p[1] for p in evals], marker="o", linewidth=1, label="eval loss")
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, out)
    return True


def _throughput(callback, train_runtime: float, tokens_total: int) -> dict[str, Any]:
    """The summary's tokens/s with the warm-up steps left out (all steps when the run ended in
    its warm-up), and the all-steps figure beside it."""
    overall = round(tokens_total / train_runtime, 2) if train_runtime > 0 else None
    steady = callback.steady_tokens_per_s()
    return {
        "tokens_per_s": round(steady, 2) if steady is not None else overall,
        "tokens_per_s_with_warmup": overall,
        "warmup_steps_excluded": callback.warmup_steps if steady is not None else 0,
    }


def _close_process_group() -> None:
    """Destroy this rank's process group before the interpreter exits: a gloo group left to
    interpreter teardown can abort the rank (``terminate called without an active exception``)
    when its peer has already closed the connections, turning a finished run into a failed one."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the run's result is already written; report and go on
        print(f"process group teardown: {type(exc).__name__}: {exc}", flush=True)


def main(run_path: str) -> int:
    run = RunDir(Path(run_path))
    rank, world_size, local_rank = dist_env()
    if world_size > 1:  # under torchrun: this rank's output goes to its own log file
        fd = os.open(run.rank_log(rank), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    writer = EventWriter(run.events_path)
    writer.emit(
        "rank_started",
        rank=rank,
        local_rank=local_rank,
        pid=os.getpid(),
        node_rank=int(os.environ.get("GROUP_RANK", 0)),
        host=socket.gethostname(),
    )
    if rank != 0:
        writer.close()
        writer = None
    cfg = load_run_config(run)
    from cockpit.telemetry.torch_backend import start_node_telemetry

    # every node's GPUs and heartbeat, through the rendezvous store (local rank 0 of each node)
    start_node_telemetry(cfg, rank, local_rank, int(os.environ.get("GROUP_RANK", 0)), socket.gethostname(), EventWriter(run.events_path).emit if rank == 0 else None)
    t0 = time.time()
    try:
        code = _train(run, cfg, rank, world_size, local_rank, writer, t0)
        from cockpit.telemetry import node as node_telemetry

        node_telemetry.finish()
        _close_process_group()
        return code
    except InputError as exc:
        if writer:
            writer.emit("run_failed", reason=f"invalid input: {exc}", rank=rank)
        print(f"cockpit: invalid input: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except Exception as exc:  # noqa: BLE001 - reported, with the traceback in the rank's log
        traceback.print_exc()
        reason = f"{type(exc).__name__}: {exc}"
        if is_oom(exc):
            reason = f"out of memory in rank {rank}: {reason}"
            if writer:
                writer.emit(
                    "alert",
                    level="error",
                    code="oom",
                    message=reason[:500],
                    remedies=OOM_REMEDIES,
                    rank=rank,
                )
        if writer:
            writer.emit("run_failed", reason=reason[:2000], rank=rank)
        return EXIT_FAILED


def _apply_strategy(run: RunDir, cfg: dict[str, Any], model, rank: int, world_size: int, local_rank: int, use_cpu: bool, n_rows: int, log) -> tuple[dict[str, Any], bool]:
    """DeepSpeed: the config (user file or generated) filled as HF fills it, validated by DeepSpeed,
    written to RUN_DIR/ds_config.json. FSDP: a torch check. Returns (cfg, parameters sharded?)."""
    if cfg.get("fsdp"):
        from cockpit.strategy.fsdp import check_torch

        if world_size < 2:
            raise InputError("fsdp: FSDP shards over several processes; set nproc_per_node (or nnodes) above 1")
        reason = check_torch()
        if reason:
            raise InputError(f"fsdp: {reason}")
        return cfg, True
    if not (cfg.get("deepspeed") or cfg.get("zero_stage")):
        return cfg, False
    from cockpit.strategy import deepspeed as ds

    source, name = ds.source({**cfg, "use_cpu": use_cpu})
    micro, gas = cfg["per_device_train_batch_size"], cfg["gradient_accumulation_steps"]
    steps = cfg["max_steps"] if cfg["max_steps"] > 0 else max(1, math.ceil(math.ceil(n_rows / (micro * world_size)) / gas * cfg["num_train_epochs"]))
    hidden = getattr(getattr(model, "config", None), "hidden_size", None) or ds.hidden_size_of(cfg["model_name_or_path"])
    filled = ds.effective(source, cfg, file=name, hidden_size=hidden, num_training_steps=steps, ws=world_size)
    if rank == 0:
        atomic_write_json(run.path / "ds_config.json", filled)
        log(f"DeepSpeed ZeRO-{(filled.get('zero_optimization') or {}).get('stage', 0)} config ({name}) validated; written to ds_config.json")
    stage = int((filled.get("zero_optimization") or {}).get("stage", 0))
    return {**cfg, "deepspeed": source}, stage == 3


def _config_only(ref):
    """Something with the model's ``config.hidden_size`` (DeepSpeed's buckets) before the model exists."""
    from types import SimpleNamespace

    from cockpit.strategy.deepspeed import hidden_size_of

    return SimpleNamespace(config=SimpleNamespace(hidden_size=hidden_size_of(ref.path)))


def report_peak_memory(run: RunDir, writer, rank: int, local_rank: int, phase: str) -> None:
    """Every rank: a ``rank_memory`` event with its peak resident memory (VmHWM) so far."""
    from cockpit.train.sharded_load import peak_rss_mb

    fields = {"rank": rank, "local_rank": local_rank, "node_rank": int(os.environ.get("GROUP_RANK", "0")), "phase": phase, "vmhwm_mb": peak_rss_mb()}
    if writer is not None:
        writer.emit("rank_memory", **fields)
    else:
        with EventWriter(run.events_path) as own:
            own.emit("rank_memory", **fields)


def _placed_model(run: RunDir, cfg: dict[str, Any], ref, args, rank: int, local_rank: int, use_cpu: bool, sharded: bool, log):
    """The model on its training device (sharded for FSDP2), and the Trainer class to use.
    ZeRO-3 / FSDP2 never hold a full copy on every rank (:mod:`cockpit.train.sharded_load`)."""
    import gc

    from cockpit.train import sharded_load
    from cockpit.train.trainer import CockpitTrainer

    world_size = int(args.world_size)
    mode = sharded_load.load_mode(cfg, ref, sharded, world_size)
    if world_size > 1:
        _ = args.device  # sets up the process group (gloo / nccl) that zero.Init, fully_shard and the broadcast use
    extras: dict[str, Any] | None = None
    if mode == "fsdp_meta":
        extras = {}
        if rank == 0:  # the adapters' seeded init, exactly as a one-rank run makes it (the base weights stay unread)
            real = build_model(cfg, ref, use_cpu, local_rank)
            extras = sharded_load.not_in_checkpoint(real, ref.path)
            del real
            gc.collect()
        model = build_model(cfg, ref, use_cpu, local_rank, load="meta")
    else:
        model = build_model(cfg, ref, use_cpu, local_rank, load=mode)
    log(f"model loaded ({mode})")
    if not cfg.get("fsdp"):
        return model, CockpitTrainer
    from cockpit.strategy.fsdp import shard, shard_report, trainer_class, write_report

    dtype = next(model.parameters()).dtype
    info = shard(model, cfg["fsdp"], use_cpu=use_cpu, local_rank=local_rank, nnodes=int(cfg["nnodes"]), bf16=cfg["bf16"], fp16=cfg["fp16"])
    if extras is not None:
        device = args.device
        info["sharded_load"] = sharded_load.fsdp2_materialise_and_load(model, ref.path, extras, rank=rank, device=device, dtype=dtype, log=log)
    report = shard_report(model)
    write_report(run.path, rank, info, report)
    log(f"FSDP2: {info['wrapped_modules']} x {info['layer_classes']} + root sharded over mesh {info['mesh']}; local {report['local_numel']} of {report['global_numel']} parameters")
    return model, trainer_class(CockpitTrainer)  # saves gather the sharded state dict first


def _train(run: RunDir, cfg: dict[str, Any], rank: int, world_size: int, local_rank: int, writer, t0: float) -> int:
    if cfg.get("stage", "sft") != "sft":  # pt / dpo / kto / rm: a recipe (cockpit/train/recipes/)
        from cockpit.train.recipes import run_stage

        return run_stage(run, cfg, rank, world_size, local_rank, writer, t0)
    import torch
    from cockpit.data.packing import build_collator
    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model
    from cockpit.train.callbacks import CockpitCallback
    from cockpit.train.placement import ProbesBeforeTraining
    from cockpit.train.variants import trainer_kwargs
    from cockpit.train.probes import load_probes, probe_summary, run_probes

    def log(msg: str) -> None:
        print(f"[rank{rank}] {msg}", flush=True)

    use_cpu = _use_cpu(cfg)
    cfg = rank_precision(cfg, use_cpu, writer, log)
    from cockpit.train.kernels import kernel_arguments

    kernel_arguments(cfg, use_cpu)  # enable_liger_kernel / torch_compile: refused before loading anything
    if not use_cpu and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dirs = artefact_dirs(run, cfg)
    dirs["out"].mkdir(parents=True, exist_ok=True)
    ref = resolve_model(cfg["model_name_or_path"], log=log)
    tok = load_tokenizer(cfg, ref, log=log)
    prepared = prepare_dataset(cfg, tok)
    log("data: " + " | ".join(prepared.report.lines()))
    rows = [{"input_ids": r.input_ids, "labels": r.labels} for r in prepared.rendered if r.target_kept > 0]
    if not rows:
        raise InputError(f"cutoff_len {cfg['cutoff_len']}: every sample loses all its assistant tokens; nothing to train on")
    eval_rows: list[dict[str, list[int]]] = []
    if cfg["val_size"]:
        import random

        rng = random.Random(cfg["seed"])
        rng.shuffle(rows)
        n_eval = int(cfg["val_size"]) if cfg["val_size"] >= 1 else max(1, int(len(rows) * cfg["val_size"]))
        eval_rows, rows = rows[:n_eval], rows[n_eval:]
    if cfg.get("eval_dataset"):
        from cockpit.train.variants import eval_dataset_rows

        eval_rows = eval_dataset_rows(cfg, tok)
    # the strategy (and so the DeepSpeed config) before the model: ZeRO-3 partitions at load
    cfg, sharded = _apply_strategy(run, cfg, _config_only(ref), rank, world_size, local_rank, use_cpu, len(rows), log)
    args = training_arguments(cfg, dirs, use_cpu, world_size)
    if world_size > 1 and cfg.get("comm_probe", True):
        comm_health_probe(writer, use_cpu, log)
    model, trainer_cls = _placed_model(run, cfg, ref, args, rank, local_rank, use_cpu, sharded, log)
    report_peak_memory(run, writer, rank, local_rank, "loaded")
    probes = load_probes(cfg["probes"]) if cfg.get("probes") else []
    callback = CockpitCallback(run, cfg, rank, world_size, writer)
    probes_before = ProbesBeforeTraining(tok, probes, cfg["probe_max_new_tokens"], writer, rank, fsdp=bool(cfg.get("fsdp")), log=log)
    trainer = trainer_cls(
        model=model,
        args=args,
        train_dataset=ListDataset(rows),
        eval_dataset=ListDataset(eval_rows) if eval_rows else None,
        data_collator=build_collator(cfg, tok, model),
        processing_class=tok,
        callbacks=[callback, probes_before],
        **trainer_kwargs(cfg, model, args),  # a LoRA+ optimizer
    )
    probes_before.trainer = trainer
    resume, before = resume_point(cfg, dirs, writer, log)
    callback.first_loss = before.get("first_loss")  # the run's, not this attempt's
    train_t0 = time.time()
    trainer.run_totals = lambda: {"first_loss": callback.first_loss, "train_time_s": round(before.get("train_time_s", 0.0) + time.time() - train_t0, 3), "tokens_seen": callback.tokens_total}
    trainer.train(resume_from_checkpoint=resume or None)
    train_runtime = before.get("train_time_s", 0.0) + time.time() - train_t0  # the run's, over its attempts
    report_peak_memory(run, writer, rank, local_rank, "trained")
    stopped = callback.stop_reason is not None
    poisoned = callback.nan_seen or not trainer.loss_finite
    adapter_from = None
    # final adapter / model: never from weights trained through a NaN
    if poisoned:
        adapter_from = adapter_from_last_good(dirs, rank, log)
    elif rank == 0 or cfg.get("deepspeed") or cfg.get("fsdp"):
        trainer.save_model(str(dirs["adapter"]))
        if rank == 0:
            tok.save_pretrained(str(dirs["adapter"]))
    probe_after = None
    if probes and (rank == 0 or sharded):  # sharded parameters: every rank joins generate's gathers
        log("probes after training")
        from contextlib import nullcontext

        from cockpit.strategy.fsdp import gathered_root

        with gathered_root(trainer.model) if cfg.get("fsdp") else nullcontext():
            probe_after = run_probes(trainer.model, tok, probes, cfg["probe_max_new_tokens"])
        if rank == 0:
            writer.emit("probe_results", phase="after", **probe_after)
    report_peak_memory(run, writer, rank, local_rank, "finished")
    probe_before = probes_before.result
    if rank != 0:
        if local_rank == 0 and int(os.environ.get("GROUP_RANK", 0)) > 0:  # another node's run dir ends too
            EventWriter(run.events_path).emit("run_stopped" if stopped else "run_finished", steps=trainer.state.global_step, node_rank=int(os.environ["GROUP_RANK"]), reason=callback.stop_reason)
        return EXIT_OK
    events = read_all(run.events_path)  # once, for loss.png and the summary's eval losses
    plotted = bool(cfg["plot_loss"]) and plot_loss(run.events_path, dirs["plot"], events)
    state = trainer.state
    tokens_total = int(getattr(state, "num_input_tokens_seen", 0) or callback.tokens_total)  # the run's (restored on resume)
    summary = {
        "run_id": run.run_id,
        "state": "stopped" if stopped else "finished",
        "reason": callback.stop_reason,
        "steps": state.global_step,
        "total_steps": state.max_steps,
        "epochs": state.epoch,
        "runtime_s": round(time.time() - t0, 2),
        "train_runtime_s": round(train_runtime, 2),
        "tokens_seen": tokens_total,
        **_throughput(callback, train_runtime, tokens_total),
        "first_loss": callback.first_loss,
        "last_loss": callback.last_loss,
        "eval_loss": eval_losses(events),
        "probes_before": probe_summary(probe_before),
        "probes_after": probe_summary(probe_after),
        "adapter_dir": str(dirs["adapter"]) if not poisoned or adapter_from else None,
        "adapter_from": adapter_from,
        "nan_step": callback.nan_step,
        "checkpoints_dir": str(dirs["checkpoints"]),
        "loss_plot": str(dirs["plot"]) if plotted else None,
        "samples": len(rows),
        "truncation": prepared.report.as_dict(),
    }
    if poisoned:
        where = f"adapter = {adapter_from}" if adapter_from else "no adapter (no checkpoint before the NaN)"
        what = "stopped on NaN" if cfg["nan_policy"] == "stop" else "loss not finite since"
        summary["reason"] = f"{callback.stop_reason or 'loss became nan'}: {what} at step {callback.nan_step or state.global_step}; {where}"
    atomic_write_json(run.summary_path, summary)
    if callback.nan_seen and cfg["nan_policy"] == "stop":
        summary["state"] = "failed"
        atomic_write_json(run.summary_path, summary)
        writer.emit("run_failed", reason=summary["reason"], rank=0)
        return EXIT_FAILED
    if stopped:
        writer.emit("run_stopped", reason=callback.stop_reason, step=state.global_step)
    else:
        writer.emit(
            "run_finished",
            steps=state.global_step,
            runtime_s=summary["runtime_s"],
            tokens_per_s=summary["tokens_per_s"],
            first_loss=callback.first_loss,
            last_loss=callback.last_loss,
        )
    return EXIT_OK


def exit_rank(code: int) -> None:
    """Leave the process. Several ranks: ``os._exit`` once the run's results are written and the
    process group is gone, skipping interpreter and C++ static teardown, where a gloo/TCPStore
    background thread still joinable aborts the rank ("terminate called without an active
    exception", exit -6) and torchrun reports a finished run as failed (a finished two-rank DDP run
    was reported failed in CI with rank 0's training done; not reproduced in 6 runs here)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_rank(main(sys.argv[1]))
