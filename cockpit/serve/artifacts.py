"""What a finished run offers for serving and chat: adapter, base model, LoRA rank, template,
probes. Reads the run dir only; no torch (the UI calls this)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cockpit.config.run_config import RunConfig
from cockpit.errors import InputError
from cockpit.store.output_mark import foreign_adapter
from cockpit.store.rundir import RunDir


@dataclass
class RunArtifacts:
    run: RunDir
    config: RunConfig
    adapter_dir: Path
    is_lora: bool
    lora_rank: int | None
    base_model: str  # model_name_or_path as configured
    template: str | None
    probes_file: str | None
    merged_dir: Path | None = None  # an existing `cockpit export --merge` output
    adapter_config: dict[str, Any] = field(default_factory=dict)

    @property
    def run_id(self) -> str:
        return self.run.run_id

    def base_model_dir(self, log=lambda *_: None) -> str:
        """A path (or hub id) a server or transformers can load the base model from."""
        from cockpit.models.resolve import resolve_model

        ref = resolve_model(self.base_model, log=log, revision=self.config.model_revision)
        if ref.gguf_file:
            raise InputError(
                f"the base model {self.base_model} is a GGUF file; vLLM's LoRA needs a Hugging Face folder: "
                "export with --merge and serve the merged folder"
            )
        return ref.path

    def chat_template_text(self) -> str | None:
        """The run's named chat template (Jinja; ``default`` is LLaMA-Factory's ``default``), or None
        when it used the tokenizer's own."""
        from cockpit.data.render import NAMED_TEMPLATES, TEMPLATE_ALIASES

        if not self.template:
            return None
        return NAMED_TEMPLATES.get(TEMPLATE_ALIASES.get(self.template, self.template))

    def max_new_tokens(self) -> int:
        return int(self.config.probe_max_new_tokens or 40)

    def model_type(self) -> str:
        """The model type in the base model's config.json (read as JSON: no torch), e.g. ``llava``."""
        path = Path(self.base_model_dir()) / "config.json"
        try:
            return str(json.loads(path.read_text(encoding="utf-8")).get("model_type") or "")
        except (OSError, ValueError, AttributeError) as exc:
            raise InputError(f"cannot read the base model's {path}: {exc}") from exc

    def refuse_images(self, key: str = "--image") -> None:
        """InputError naming the model type unless the run's model reads images (a vision-language model)."""
        from cockpit.errors import Problem
        from cockpit.models.vlm import COMPOSITE

        kind = self.model_type()
        if kind not in COMPOSITE:
            raise InputError(
                Problem(
                    f"{self.run_id}'s model {self.base_model} (model type {kind!r}) is a text model: it reads no "
                    f"images (vision-language models: {', '.join(sorted(COMPOSITE))})",
                    key=key,
                )
            )


def load_run(run: RunDir) -> RunArtifacts:
    if not run.config_path.exists():
        raise InputError(f"{run.path} has no config.yaml (not a cockpit run dir)")
    cfg = RunConfig.from_resolved(yaml.safe_load(run.config_path.read_text(encoding="utf-8")))
    summary = run.read_summary()
    adapter = Path(summary.get("adapter_dir") or run.output_dir() / "adapter")
    if not adapter.is_dir():
        state = run.read_status().get("state")
        raise InputError(
            f"{run.run_id} has no saved adapter/model at {adapter} (state: {state}); wait for it to finish or save"
        )
    if why := foreign_adapter(run, summary):  # another run wrote over its output_dir: not its weights
        raise InputError(why)
    adapter_config: dict[str, Any] = {}
    is_lora = (adapter / "adapter_config.json").exists()
    if is_lora:
        adapter_config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
    merged = None
    for cand in (run.output_dir() / "merged",):
        if (cand / "config.json").exists() and _export_run_id(cand) == run.run_id:  # not another run's
            merged = cand
    return RunArtifacts(
        run=run,
        config=cfg,
        adapter_dir=adapter.resolve(),
        is_lora=is_lora,
        lora_rank=int(adapter_config["r"]) if is_lora and adapter_config.get("r") else None,
        base_model=str(cfg.model_name_or_path or adapter_config.get("base_model_name_or_path") or ""),
        template=cfg.template,
        probes_file=cfg.probes,
        merged_dir=merged,
        adapter_config=adapter_config,
    )


def _export_run_id(folder: Path) -> str | None:
    """The run a ``cockpit export`` folder was made from (its ``cockpit_export.json``)."""
    try:
        return json.loads((folder / "cockpit_export.json").read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


def load_run_probes(art: RunArtifacts) -> list[dict[str, Any]]:
    if not art.probes_file:
        raise InputError(f"{art.run_id} has no probes (config key 'probes' is unset)")
    from cockpit.data.probes import load_probes

    return load_probes(art.probes_file)
