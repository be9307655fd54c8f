"""Everything ``cockpit check`` verifies before a run: config, model, data, probes, precision.

Imports transformers (for the tokenizer) lazily; never imported by the UI process, which
calls ``cockpit check --json`` in a subprocess instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.errors import InputError, Problem

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig


@dataclass
class CheckResult:
    cfg: RunConfig
    report: Any = None  # TruncationReport
    formats: dict[str, str] = field(default_factory=dict)
    bad_rows: list[Problem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    samples: int = 0
    model_path: str | None = None
    preview: dict[str, Any] | None = None  # first rendered sample: text pieces, trained or not
    template: str | None = None  # which chat template rendered the data (render.template_description)
    images: dict[str, Any] | None = None  # the data's images: sizes, image tokens (cockpit.data.media.image_report)
    batches: str | None = None  # how the rank batches, in words, its model asked (data.packing.resolve_for_model)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": True,
            "samples": self.samples,
            "formats": self.formats,
            "bad_rows": [str(p) for p in self.bad_rows],
            "warnings": self.warnings,
            "truncation": self.report.as_dict() if self.report else None,
            "model_path": self.model_path,
            "preview": self.preview,
            "template": self.template,
            "images": self.images,
        }


def has_checkpoints(folder: Path) -> bool:
    ck = folder / "checkpoints"
    return any(p.name.startswith("checkpoint-") for p in (list(ck.iterdir()) if ck.is_dir() else [])) or any(
        p.name.startswith("checkpoint-") for p in (list(folder.iterdir()) if folder.is_dir() else [])
    )


def static_checks(cfg: RunConfig, gpus: int | None = None) -> list[str]:
    """Checks that need no model (cheap): raises InputError; returns warnings. They include the
    gate (:func:`cockpit.preflight.environment.gate_problems`: what the ranks would refuse on a
    machine with ``gpus`` GPUs; None: this machine's, counted with torch only when a kernel key asks)."""
    from cockpit.preflight.environment import gate_problems

    warnings: list[str] = []
    problems: list[Problem] = []
    if float(cfg.learning_rate or 0) > 1.0:
        warnings.append(
            f"learning_rate {cfg.learning_rate:g} is absurdly high: expect a NaN/inf loss (nan_policy: {cfg.nan_policy})"
        )
    if cfg.trust_remote_code:
        warnings.append("trust_remote_code is true: Python code shipped with the model will run in the training ranks")
    if gpus is None:  # a run on this machine (a Slurm job's node has its own cores)
        warnings += loader_workers_note(cfg, len(os.sched_getaffinity(0)))
    out = cfg.output_dir
    if out and has_checkpoints(Path(out)) and not cfg.overwrite_output_dir and not cfg.resume_from_checkpoint:
        problems.append(
            Problem(
                f"{out} already holds checkpoints; set overwrite_output_dir: true or choose another folder",
                key="output_dir",
            )
        )
    problems += adapter_problems(cfg)
    problems += gate_problems(cfg, gpus)
    if cfg.probes:
        from cockpit.data.probes import load_probes

        try:
            load_probes(cfg.probes)
        except InputError as exc:
            problems += exc.problems
    if problems:
        raise InputError(problems)
    return warnings


def image_probe_problems(cfg: RunConfig, model_config: Any) -> list[Problem]:
    """A probes file with image probes for a text model (the ranks would refuse it after loading the model)."""
    from cockpit.data.probes import load_probes
    from cockpit.models.vlm import composite_of

    if not cfg.probes or composite_of(model_config) is not None:
        return []
    try:
        images = sum(1 for p in load_probes(cfg.probes) if "image_path" in p)
    except InputError:  # its bad lines are named by static_checks' own reading of the file
        return []
    if not images:
        return []
    model_type = getattr(model_config, "model_type", None)
    why = (
        f"{images} image probe(s) in {cfg.probes}, and model type {model_type!r} is a text model: image probes "
        "need a vision-language model (drop their 'image' or use a text probes file)"
    )
    return [Problem(why, key="probes")]


def loader_workers_note(cfg: RunConfig, cores: int) -> list[str]:
    """``dataloader_num_workers`` loader processes per rank, each beside its rank: more processes than
    the CPU cores this machine gives (``cores``) compete with the training for them."""
    workers, ranks = int(cfg.dataloader_num_workers or 0), int(cfg.nproc_per_node or 1)
    procs = ranks * (workers + 1)
    if not workers or procs <= cores:
        return []
    return [
        f"dataloader_num_workers: {workers} starts {workers} loader processes beside each of the {ranks} rank(s): "
        f"{procs} processes on {cores} CPU cores, competing with the training for them "
        f"(at most {max(0, cores // ranks - 1)} here; 0 loads in the rank itself)"
    ]


def adapter_problems(cfg: RunConfig) -> list[Problem]:
    """A prediction-only run's ``adapter_name_or_path`` must be a LoRA adapter folder (a run's
    ``adapter/``, not the run dir around it)."""
    adapter = cfg.adapter_name_or_path
    if cfg.do_train or not adapter or (Path(adapter) / "adapter_config.json").is_file():
        return []
    inner = Path(adapter) / "adapter"
    hint = f"; did you mean {inner}?" if (inner / "adapter_config.json").is_file() else ""
    return [Problem(f"{adapter} holds no LoRA adapter (adapter_config.json){hint}", key="adapter_name_or_path")]


def prediction_data_config(cfg: RunConfig) -> RunConfig:
    """The config whose ``dataset`` is the data read before a launch: a prediction-only run's
    ``eval_dataset`` when it names one (it trains on nothing)."""
    if not cfg.do_train and cfg.eval_dataset:
        return cfg.replace(dataset=cfg.eval_dataset)
    return cfg


def doctor_gpu_reasons(cfg: RunConfig) -> list[str]:
    """The doctor's failing GPU checks for this config, one line each (why no GPU is usable)."""
    from cockpit.doctor import run_checks
    from cockpit.doctor.relevance import GPU_CHECK_IDS, config_tags, no_gpu_reasons

    keys = cfg.keys_only()
    return no_gpu_reasons(run_checks(needs=config_tags(keys), only=GPU_CHECK_IDS), keys)


def read_cpuinfo() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def device_checks(cfg: RunConfig) -> list[str]:
    """Precision / quantization against the devices this machine has (imports torch)."""
    import torch

    from cockpit.device import CPU, FP16_ON_CPU, bf16_on_cpu_warning, device_problems, resolve_device

    warnings: list[str] = []
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    needs = (cfg.use_cpu, cfg.quantization_bit)
    problems = device_problems(*needs, cfg.nproc_per_node, gpus, reasons=doctor_gpu_reasons(cfg) if gpus == 0 else None)
    if problems:  # the problems Setup's pane shows from the same function
        raise InputError(problems)
    if resolve_device(*needs, gpus) == CPU:
        if cfg.fp16:
            warnings.append(f"fp16: {FP16_ON_CPU}")
        if cfg.bf16:
            warnings += [w for w in [bf16_on_cpu_warning(read_cpuinfo())] if w]
        if int(cfg.nproc_per_node) > (torch.get_num_threads() or 1) * 4:
            warnings.append(f"{cfg.nproc_per_node} CPU ranks on {torch.get_num_threads()} threads will be slow")
    return warnings


def check_rows(cfg: RunConfig, gpus: int | None = None) -> Any:
    """The part of the check that needs no tokenizer: static checks and, for SFT, every bad row of
    the datasets (the loaded samples, for ``check_run``'s ``loaded``); None for the other stages,
    whose check reads their data itself."""
    static_checks(cfg, gpus)
    if cfg.stage != "sft":
        return None
    from cockpit.data.collect import collect_samples

    data_cfg = prediction_data_config(cfg)
    loaded = collect_samples(data_cfg)
    if cfg.eval_dataset and data_cfg is cfg:  # the eval data's bad rows too (key: eval_dataset)
        collect_samples(cfg.replace(dataset=cfg.eval_dataset))
    return loaded


def check_moe_keys(cfg: RunConfig, model_config: Any) -> None:
    """``moe_aux_loss_coef`` on a model whose forward has no router loss: refused by name
    (:mod:`cockpit.models.moe`). ``model_config``: transformers' config of the model."""
    if cfg.moe_aux_loss_coef is None:
        return
    from cockpit.models.moe import aux_loss_problem

    why = aux_loss_problem(model_config.to_dict())
    if why:
        raise InputError(Problem(why, key="moe_aux_loss_coef"))


def batches_for_model(cfg: RunConfig, model_config: Any) -> str:
    """How the rank will batch, in words, with ``packing`` auto decided for this model as the rank decides
    it (a model that cannot attend per sample in a packed row: padded; ``packing: true`` there is refused)."""
    from cockpit.data.packing import resolve_for_model
    from cockpit.data.padding import batching_words

    said: list[str] = []
    resolved = resolve_for_model(cfg, model_config, log=said.append)
    return said[0] if said else batching_words(resolved)


def check_run(
    cfg: RunConfig, log=print, with_devices: bool = True, loaded: Any = None, gpus: int | None = None
) -> CheckResult:
    """Full validation: static checks, model + tokenizer, datasets (every bad row), truncation.
    ``loaded``: ``check_rows``'s answer, when the caller already has it; ``gpus``: the GPUs where
    the run trains when that is not this machine (a Slurm job), for the gate."""
    if cfg.stage != "sft":  # pt / dpo / kto / rm: the stage's own data
        from cockpit.preflight.stage import check_stage

        return check_stage(cfg, log, with_devices, gpus=gpus)
    from cockpit.data.media import image_report
    from cockpit.data.prepare import prepare_dataset, render_options
    from cockpit.data.render import template_description, trainable_spans
    from cockpit.models.resolve import config_model, load_model_config, load_tokenizer
    from cockpit.models.vlm import refuse_unhonoured

    warnings = static_checks(cfg, gpus)
    data_cfg = prediction_data_config(cfg)
    if loaded is None:
        loaded = check_rows(cfg, gpus)  # every bad row, before any model is loaded
    if with_devices:
        warnings += device_checks(cfg)
    ref = config_model(cfg, log=log)
    tok = load_tokenizer(cfg, ref, log=log)
    mcfg = load_model_config(cfg, ref)
    check_moe_keys(cfg, mcfg)
    warnings += refuse_unhonoured(cfg, mcfg)  # the vision-language keys: each with an effect on this model
    if probe_problems := image_probe_problems(cfg, mcfg):
        raise InputError(probe_problems)
    hidden = getattr(mcfg, "hidden_size", None)
    if cfg.finetuning_type == "lora" and hidden and cfg.lora_rank > hidden:
        raise InputError(
            Problem(f"lora_rank {cfg.lora_rank} exceeds the model's hidden size {hidden}", key="lora_rank")
        )
    if cfg.finetuning_type == "freeze":
        layers = getattr(mcfg, "num_hidden_layers", None)
        if layers and abs(cfg.freeze_trainable_layers) > layers:
            raise InputError(
                Problem(
                    f"freeze_trainable_layers {cfg.freeze_trainable_layers} but the model has {layers} layers",
                    key="freeze_trainable_layers",
                )
            )
    prepared = prepare_dataset(data_cfg, tok, loaded)
    first = prepared.loaded.samples[0]
    text, spans = trainable_spans(tok, first["messages"], tools=first.get("tools"), **render_options(cfg))
    pieces, pos = [], 0
    for a, b in spans:
        pieces += [{"text": text[pos:a], "trained": False}, {"text": text[a:b], "trained": True}]
        pos = b
    pieces.append({"text": text[pos:], "trained": False})
    if prepared.report.emptied == prepared.report.samples:
        raise InputError(
            Problem(
                f"every sample loses all its assistant tokens at cutoff_len {cfg.cutoff_len}; nothing to train on",
                key="cutoff_len",
            )
        )
    if prepared.report.emptied:
        warnings.append(f"{prepared.report.emptied} samples keep no assistant token after truncation; raise cutoff_len")
    if int(cfg.max_steps or -1) <= 0:  # with max_steps, validation's note said it
        from cockpit.config.notes import logging_note, planned_steps

        flat = cfg.mapping()
        note = logging_note(flat, planned_steps(flat, len(prepared.trainable), cfg.world_size))
        warnings += [note] if note else []
    return CheckResult(
        cfg=cfg,
        report=prepared.report,
        formats=prepared.loaded.formats,
        bad_rows=prepared.loaded.problems,
        warnings=warnings,
        samples=len(prepared.trainable),  # what the ranks train on
        model_path=ref.path,
        preview={"source": prepared.loaded.samples[0]["source"], "pieces": [p for p in pieces if p["text"]]},
        template=template_description(tok),
        images=image_report(prepared.loaded.samples),
        batches=batches_for_model(cfg, mcfg),
    )
