"""Export a run: the LoRA adapter as saved (PEFT format), or merged into the base model.

The merged folder is safetensors + tokenizer + chat template, loadable by
``AutoModelForCausalLM.from_pretrained`` and by vLLM. A QLoRA run merges into the
unquantized base weights (never into 4-bit ones). ``cockpit_export.json`` records what the
export was made from.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from cockpit.config.run_config import RunConfig
from cockpit.errors import InputError
from cockpit.store.output_mark import foreign_adapter
from cockpit.store.rundir import RunDir


def adapter_checksum(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.glob("adapter_model.*")) or sorted(folder.glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


MERGE_DTYPES = ("auto", "float32", "bfloat16", "float16")


def run_tokenizer(adapter: Path, cfg: RunConfig, ref=None) -> Any:
    """The tokenizer the run trained with: the one saved beside its adapter (its added tokens
    included), else the base's with the config's tokens added."""
    from transformers import AutoTokenizer

    if (adapter / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(adapter))
    from cockpit.models.resolve import load_tokenizer

    return load_tokenizer(cfg, ref)


def _save_tokenizer(adapter: Path, cfg: RunConfig, out: Path, ref=None) -> None:
    """The run's tokenizer with its chat template (the named one the run used, when it set one),
    so that vLLM and ``apply_chat_template`` render prompts exactly as training did."""
    from cockpit.data.render import apply_template_choice

    tok = run_tokenizer(adapter, cfg, ref)
    template = cfg.template
    if template or cfg.default_system or cfg.enable_thinking is False:
        apply_template_choice(tok, template, cfg.default_system, cfg.enable_thinking)
    tok.save_pretrained(out)


def export_run(
    run: RunDir, out: Path | None = None, merge: bool = False, log=print, dtype: str = "auto"
) -> dict[str, Any]:
    """Export RUN's adapter (copied as saved, PEFT format), or with ``merge`` the base model with
    the adapter merged (``dtype``: auto = the run's precision, :func:`merge_dtype`)."""
    cfg = RunConfig.from_resolved(yaml.safe_load(run.config_path.read_text(encoding="utf-8")))
    summary = run.read_summary()
    adapter = _saved_adapter_dir(run, summary)
    is_lora = (adapter / "adapter_config.json").exists()
    out = _empty_export_dir(run, out, merge)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    notes: list[str] = []
    if summary.get("adapter_from"):
        notes.append(
            f"the loss was not finite from step {summary.get('nan_step')}: these are the weights of {summary['adapter_from']}, the last checkpoint before it"
        )
    merged_dtype = None
    adapter_config = json.loads((adapter / "adapter_config.json").read_text()) if is_lora else {}
    try:
        if merge and is_lora:
            merged_dtype, merge_notes = _merge_into_base(adapter, cfg, tmp, dtype, log)
            notes += merge_notes
            kind = "merged"
        else:
            shutil.copytree(adapter, tmp, dirs_exist_ok=True)
            kind = "adapter" if is_lora else "model"
            if merge and not is_lora:
                notes.append(f"a {cfg.finetuning_type} run saves the whole model: nothing to merge")
        record = {
            "kind": kind,
            "run_id": run.run_id,
            "base_model": cfg.model_name_or_path,
            "finetuning_type": cfg.finetuning_type,
            "adapter_dir": str(adapter),
            "adapter_sha256": adapter_checksum(adapter) if is_lora else None,
            "template": cfg.template,
            "lora_rank": adapter_config.get("r"),
            "lora_alpha": adapter_config.get("lora_alpha"),
            "target_modules": adapter_config.get("target_modules"),
            "dtype": merged_dtype,
            "notes": notes,
        }
        (tmp / "cockpit_export.json").write_text(json.dumps(record, indent=2) + "\n")
        if out.exists():
            out.rmdir()
        tmp.chmod(ordinary_dir_mode())  # mkdtemp's 0700 would keep a vLLM server of another user out
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    record["path"] = str(out)
    return record


def ordinary_dir_mode() -> int:
    """The mode ``mkdir`` gives a folder here: 0777 less the umask (0755 with the usual 022)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o777 & ~mask


def _saved_adapter_dir(run: RunDir, summary: dict[str, Any]) -> Path:
    """The folder of the run's saved adapter (or whole model); InputError when there is none."""
    adapter = Path(summary.get("adapter_dir") or run.output_dir() / "adapter")
    if not adapter.is_dir():
        raise InputError(
            f"{run.run_id} has no saved adapter/model at {adapter} (state: {run.read_status().get('state')})"
        )
    if why := foreign_adapter(run, summary):  # another run wrote over its output_dir: not its weights
        raise InputError(why)
    return adapter


def _empty_export_dir(run: RunDir, out: Path | None, merge: bool) -> Path:
    """The export's folder (default: the run's merged/ or export/); InputError when it has files."""
    out = Path(out) if out else run.output_dir() / ("merged" if merge else "export")
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} exists and is not empty; choose another --out")
    return out


def merge_dtype(cfg: RunConfig) -> str:
    """``--dtype auto``: the run's precision. bf16 runs merge in bf16; a QLoRA run in fp16 in fp16
    (its 4-/8-bit layers computed in fp16, as LLaMA-Factory's export infers); the rest in float32
    (a LoRA run in fp16 trained fp32 adapters over its base)."""
    if cfg.bf16:
        return "bfloat16"
    return "float16" if cfg.fp16 and cfg.quantization_bit else "float32"


PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json")


def _save_processor(cfg: RunConfig, ref: Any, out: Path, load_processor: Any) -> None:
    """A vision-language base's processor files beside the merged model: copied as they are from a local
    folder (a Qwen-VL processor does not load here without torchvision: it wants a video processor, so it is
    not loaded and saved again), else loaded (AutoProcessor) and saved."""
    folder = Path(ref.path)
    if not folder.is_dir():
        load_processor(cfg, ref).save_pretrained(out)
        return
    for name in PROCESSOR_FILES:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, out / name)


def _merge_into_base(adapter: Path, cfg: RunConfig, tmp: Path, dtype: str, log) -> tuple[str, list[str]]:
    """Merge the LoRA adapter into the base model and save it with the tokenizer in TMP: (dtype, notes)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from cockpit.models.resolve import config_model, load_model_config, load_processor
    from cockpit.models.vlm import composite_of

    notes: list[str] = []
    ref = config_model(cfg, log=log)
    if dtype not in MERGE_DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(MERGE_DTYPES)}")
    tdtype = getattr(torch, merge_dtype(cfg) if dtype == "auto" else dtype)
    if cfg.quantization_bit:
        notes.append(
            f"QLoRA run: the adapter is merged into the unquantized base weights ({str(tdtype).replace('torch.', '')}), "
            f"not into dequantized {cfg.quantization_bit}-bit weights"
        )
    # no quantization_config here: a QLoRA adapter merges into the unquantized weights
    # a vision-language model (issue 63): its image-text class, and its processor beside it
    vlm = composite_of(load_model_config(cfg, ref)) is not None
    auto = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
    base = auto.from_pretrained(ref.path, dtype=tdtype, trust_remote_code=bool(cfg.trust_remote_code), **ref.kwargs())
    if getattr(base.config, "quantization_config", None):
        notes.append("the base model folder itself is quantized; the merge is into those weights as loaded")
    from cockpit.models.vocab import resize_to_tokenizer

    # rows for the run's added tokens, as training made them (the adapter holds their weights), or its template's
    resize_to_tokenizer(base, run_tokenizer(adapter, cfg, ref), mean_resizing=False)
    model = PeftModel.from_pretrained(base, str(adapter)).merge_and_unload()
    model.save_pretrained(tmp, safe_serialization=True)
    if vlm:  # the processor (its image processor's settings); the run's tokenizer then replaces the base's
        _save_processor(cfg, ref, tmp, load_processor)
    _save_tokenizer(adapter, cfg, tmp, ref)
    return str(tdtype).replace("torch.", ""), notes
