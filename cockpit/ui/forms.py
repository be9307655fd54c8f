"""The Setup form as plain data: fields grouped like the schema, form <-> config mapping,
validation (the same ``validate`` as ``cockpit check``), the fit line and the preview.

No textual here: the Setup screen renders :data:`GROUPS` and keeps a :class:`FormModel`. The loader
(``cockpit.config.load``: YAML, the run config, the stage rules) is imported where it is used: the
field list needs only the schema, and the cockpit's first frame waits for what this module imports.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.config.schema import SCHEDULERS, SCHEMA
from cockpit.errors import InputError
from cockpit.models.vlm import VLM_KEYS  # torch-free
from cockpit.ui.palette import themed

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

METHODS = (
    ("LoRA", "lora"),
    ("QLoRA (LoRA + 4-bit base)", "qlora"),
    ("Freeze (last N layers)", "freeze"),
    ("Full", "full"),
    ("OFT (orthogonal blocks)", "oft"),
)
STRATEGIES = (
    ("Single process", "single"),
    ("DDP (GPUs per node > 1)", "ddp"),
    ("FSDP full_shard auto_wrap", "fsdp"),
    ("DeepSpeed ZeRO-2", "zero2"),
    ("DeepSpeed ZeRO-3", "zero3"),
)
PRECISIONS = (("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16"))
DEVICES = (("auto (CPU when no GPU)", "auto"), ("CPU", "cpu"), ("GPU", "gpu"))


@dataclass(frozen=True)
class Field:
    id: str  # a config key, or a UI-only name (method, strategy, offload, precision, device, gpu_memory_gb)
    label: str
    kind: str = "text"  # text | bool | select
    options: tuple[tuple[str, Any], ...] = ()
    help: str = ""
    placeholder: str = ""


def _key(name: str, label: str, **kw: Any) -> Field:
    spec = SCHEMA[name]
    kind = {"bool": "bool", "choice": "select"}.get(spec.type, "text")
    opts = tuple((str(c), c) for c in spec.choices) if spec.choices and kind == "select" else ()
    ph = "" if spec.default is None else str(spec.default)
    return Field(name, label, kind, kw.pop("options", opts), kw.pop("help", spec.help), kw.pop("placeholder", ph))


GROUPS: dict[str, list[Field]] = {
    "Model": [
        _key(
            "model_name_or_path",
            "Model",
            help="embedded short name (smollm2-135m-instruct), local HF folder, .gguf file or hub id",
        ),
        _key("template", "Template", placeholder="the tokenizer's own"),
        _key("adapter_name_or_path", "Start adapter", placeholder="none"),
        # a vision-language model's keys (shown for one: VLM_FIELDS), LLaMA-Factory's defaults
        _key("image_max_pixels", "Image max pixels"),
        _key("image_min_pixels", "Image min pixels"),
        _key("freeze_vision_tower", "Freeze tower"),
        _key("freeze_multi_modal_projector", "Freeze projector"),
        _key("freeze_language_model", "Freeze LM"),
        _key("train_mm_proj_only", "Projector only"),
    ],
    "Dataset": [
        _key("dataset", "Dataset", placeholder="file.jsonl or names from dataset_info.json"),
        _key("dataset_dir", "Dataset dir", placeholder="next to the config, then built-in demo data"),
        _key("max_samples", "Max samples", placeholder="all"),
        _key("val_size", "Validation"),
        _key("allow_bad_rows", "Skip bad rows"),
    ],
    "Method": [
        _key("stage", "Stage"),
        Field("method", "Method", "select", METHODS, "LoRA, QLoRA (= lora + quantization_bit 4), freeze, full or OFT"),
        _key("lora_rank", "LoRA rank"),
        _key("lora_alpha", "LoRA alpha", placeholder="2 x rank"),
        _key("lora_dropout", "LoRA dropout"),
        _key("lora_target", "LoRA targets"),
        _key("freeze_trainable_layers", "Freeze: layers"),
        # the preference stages' keys (dpo: pref_loss sigmoid / ipo / hinge / orpo / simpo; kto: pref_beta)
        _key("pref_loss", "Pref. loss"),
        _key("pref_beta", "Pref. beta"),
        _key("pref_ftx", "Pref. SFT weight"),
        _key("simpo_gamma", "SimPO gamma"),
    ],
    "Strategy": [
        Field("strategy", "Strategy", "select", STRATEGIES, "DDP = nproc_per_node > 1; FSDP and ZeRO shard the states"),
        Field(
            "offload",
            "CPU offload",
            "bool",
            help="FSDP offload / ZeRO: offload: optimizer (ZeRO-2), optimizer+params (ZeRO-3)",
        ),
        _key("nproc_per_node", "GPUs per node"),
        _key("nnodes", "Nodes"),
        _key("deepspeed", "DeepSpeed JSON", placeholder="none: ZeRO-2/3 generate one (zero_stage, offload)"),
        Field("device", "Device", "select", DEVICES, "use_cpu"),
        Field(
            "gpu_memory_gb",
            "GPU memory GiB",
            help="for the fit line only on a GPU run (default: the detected GPUs', else the device the YAML's "
            "header names: 192 for an MI300X preset, 64 for an MI250 GCD)",
            placeholder="detected, else the preset's device",
        ),
    ],
    "Training": [
        _key("per_device_train_batch_size", "Micro-batch"),
        _key("gradient_accumulation_steps", "Accumulation"),
        _key("learning_rate", "Learning rate"),
        _key("lr_scheduler_type", "Scheduler", options=tuple((s, s) for s in SCHEDULERS)),
        _key("num_train_epochs", "Epochs"),
        _key("max_steps", "Max steps", placeholder="-1 (from epochs)"),
        _key("cutoff_len", "Cutoff (tokens)"),
        Field("precision", "Precision", "select", PRECISIONS, "bf16 / fp16 mixed precision, or fp32"),
        _key("gradient_checkpointing", "Grad checkpointing"),
        _key("logging_steps", "Log every"),
        _key("save_steps", "Save every"),
    ],
    "Output": [
        _key("output_dir", "Output dir", placeholder="the run dir"),
        _key("run_name", "Run name", placeholder="from the config file name"),
        _key("probes", "Probes", placeholder="none"),
        _key("plot_loss", "Plot loss"),
    ],
}
FIELDS: dict[str, Field] = {f.id: f for fs in GROUPS.values() for f in fs}
UI_ONLY = frozenset({"method", "strategy", "offload", "precision", "device", "gpu_memory_gb"})
# config keys the virtual fields own
# the stage keys a form shows only for the stages that read them (config/stages.py)
STAGE_FIELDS: dict[str, tuple[str, ...]] = {
    "pref_loss": ("dpo",),
    "pref_beta": ("dpo", "kto"),
    "pref_ftx": ("dpo",),
    "simpo_gamma": ("dpo",),
}


# a vision-language model's keys: the form shows them when the model is one (vlm_of)
VLM_FIELDS = ("image_max_pixels", "image_min_pixels", *VLM_KEYS)
SHOWN_IF = (*STAGE_FIELDS, *VLM_FIELDS)  # the fields hidden_fields may hide


def hidden_fields(values: dict[str, Any]) -> set[str]:
    """The form's fields that the chosen stage does not read, and the vision-language keys unless the
    model is a vision-language model (hidden, their values kept)."""
    stage = str(values.get("stage") or "sft")
    hidden = {fid for fid, stages in STAGE_FIELDS.items() if stage not in stages}
    return hidden if vlm_of(str(values.get("model_name_or_path") or "")) else hidden | set(VLM_FIELDS)


def _model_config_json(name: str) -> dict[str, Any] | None:
    """The model's own config.json (a local folder's, or a hub id's in this machine's HF cache), read as
    JSON (no transformers: the UI); None when there is none to read."""
    name = name.strip()
    folder = Path(name).expanduser()
    if not folder.is_dir() and name.count("/") == 1 and not name.startswith((".", "/", "~")):
        from cockpit.models.weights import hub_snapshot

        snap = hub_snapshot(name)
        folder = Path(snap) if snap else folder
    try:
        found = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def vlm_of(name: str) -> Any:
    """The model's parts (:class:`cockpit.models.vlm.Composite`) when its config.json names a
    vision-language model type Cockpit trains, else None."""
    from cockpit.models.vlm import COMPOSITE

    found = _model_config_json(name) if name.strip() else None
    return COMPOSITE.get(str(found.get("model_type") or "")) if found else None


def vlm_note(name: str, template: str | None) -> str:
    """What the form says under the model for a vision-language model: its type, its parts' sizes as the
    planner counts them (torch-free), the template that renders its images; "" for a text model."""
    parts = vlm_of(name)
    if parts is None:
        return ""
    from cockpit.plan.catalogue import resolve_model_config
    from cockpit.plan.params import count_params

    note = f"vision-language model ({parts.model_type})"
    try:
        counts = count_params(resolve_model_config(name)[0], allow_meta=False)
    except (InputError, ValueError, KeyError, TypeError):
        counts = None
    if counts is not None and (counts.vision or counts.projector):
        language = counts.total - counts.vision - counts.projector
        note += (
            f": vision tower {counts.vision / 1e6:.2f}M + projector {counts.projector / 1e6:.2f}M + "
            f"language model {language / 1e6:.2f}M"
        )
    chosen = (template or "").strip()
    if not chosen:
        note += f"; template: set one (LLaMA-Factory's for it: {parts.template})"
    else:
        note += f"; template {chosen}" + (
            f" (LLaMA-Factory's for it: {parts.template})" if chosen != parts.template else ""
        )
    return note + "; image keys below"


OWNED = frozenset({"finetuning_type", "quantization_bit", "fsdp", "bf16", "fp16", "use_cpu", "zero_stage", "offload"})
# ZeRO offload per stage: the values cockpit/strategy/deepspeed.py generates its config from
ZERO_OFFLOAD = {2: "optimizer", 3: "optimizer+params"}


def model_kind(name: str) -> str:
    from cockpit.models.embedded import is_embedded  # stdlib-only module

    name = (name or "").strip()
    if not name:
        return "required"
    if is_embedded(name):
        return "embedded model (converted once from the bundled GGUF)"
    p = Path(name).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return "GGUF file"
    if p.is_dir():
        return "local folder" + ("" if (p / "config.json").exists() else " (no config.json!)")
    if name.endswith(".gguf"):
        return "GGUF file (not found)"
    if name.count("/") == 1 and not name.startswith((".", "/", "~")):
        return "hub id (must be in the local HF cache, or the hub reachable)"
    return "not found"


def _zero_stage(path: str) -> tuple[int | None, bool]:
    p = Path(path).expanduser()
    try:
        zo = json.loads(p.read_text(encoding="utf-8")).get("zero_optimization") or {}
        off = any(
            isinstance(zo.get(k), dict) and str(zo[k].get("device", "none")).lower() in ("cpu", "nvme")
            for k in ("offload_optimizer", "offload_param")
        )
        return int(zo.get("stage", 0)), off
    except (OSError, ValueError, TypeError, AttributeError):
        m = re.search(r"z(?:ero)?[_-]?([0-3])", p.name.lower())
        return (int(m.group(1)) if m else None), "offload" in p.name.lower()


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass
class Checked:
    cfg: RunConfig | None
    problems: list[str]
    notes: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)  # the keys the problems are about

    @property
    def ok(self) -> bool:
        return self.cfg is not None and not self.problems


def _as_bool(spec: Any, value: Any) -> bool:
    from cockpit.config.load import coerce  # not at import: the form's defaults need no loader

    return bool(coerce(spec, value))


class FormModel:
    """Form values by field id (strings for text, bools, select values) + keys the form has no
    field for (kept from the preset, written back unchanged)."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        self.fill({"model_name_or_path": "smollm2-135m-instruct"})

    # -- config -> form ---------------------------------------------------------------------
    def fill(self, raw: dict[str, Any]) -> None:
        raw = dict(raw)
        vals: dict[str, Any] = {}
        for f in FIELDS.values():
            if f.id in UI_ONLY:
                continue
            spec = SCHEMA[f.id]
            v = raw.pop(f.id, None)
            if f.kind == "bool":
                vals[f.id] = bool(spec.default) if v is None else v if isinstance(v, bool) else _as_bool(spec, v)
            elif f.kind == "select":
                vals[f.id] = spec.default if v is None else v
            else:
                vals[f.id] = _text(v)
        ft = str(raw.pop("finetuning_type", "lora") or "lora").lower()
        qb = raw.pop("quantization_bit", None)
        vals["method"] = "qlora" if ft == "lora" and str(qb) == "4" else ft
        if qb is not None and str(qb) != "4":
            self_extra_qb = qb
        else:
            self_extra_qb = None
        fsdp = raw.pop("fsdp", None)
        zero_stage = raw.pop("zero_stage", None)
        zero_offload = str(raw.pop("offload", "none") or "none")
        ds = vals.get("deepspeed") or ""
        strategy, offload = "single", False
        if zero_stage not in (None, ""):
            strategy, offload = ("zero3" if str(zero_stage) == "3" else "zero2"), zero_offload != "none"
        elif ds:
            stage, offload = _zero_stage(ds)
            strategy = "zero3" if stage == 3 else "zero2"
        elif fsdp:
            strategy, offload = "fsdp", "offload" in str(fsdp).split()
        elif (vals.get("nproc_per_node") or "1") not in ("", "1") or (vals.get("nnodes") or "1") not in ("", "1"):
            strategy = "ddp"
        vals["strategy"], vals["offload"] = strategy, offload
        bf16, fp16 = raw.pop("bf16", False), raw.pop("fp16", False)
        vals["precision"] = (
            "bf16"
            if str(bf16).lower() in ("true", "1", "yes")
            else "fp16"
            if str(fp16).lower() in ("true", "1", "yes")
            else "fp32"
        )
        use_cpu = raw.pop("use_cpu", None)
        vals["device"] = (
            "auto" if use_cpu is None else ("cpu" if str(use_cpu).lower() in ("true", "1", "yes") else "gpu")
        )
        vals["gpu_memory_gb"] = self.values.get("gpu_memory_gb", "")
        self.values = vals
        self.extra = raw
        if self_extra_qb is not None:
            self.extra["quantization_bit"] = self_extra_qb

    # -- form -> config ---------------------------------------------------------------------
    def raw(self) -> dict[str, Any]:
        """The config mapping the form stands for (what a YAML would hold), in schema order."""
        v = self.values
        out: dict[str, Any] = dict(self.extra)
        for f in FIELDS.values():
            if f.id in UI_ONLY:
                continue
            val = v.get(f.id)
            if f.kind == "bool":
                if bool(val) != bool(SCHEMA[f.id].default):
                    out[f.id] = bool(val)
                else:
                    out.pop(f.id, None)
            elif f.kind == "select":
                if val is not None and val != SCHEMA[f.id].default:
                    out[f.id] = val
            else:
                text = (val or "").strip() if isinstance(val, str) else val
                if text not in ("", None):
                    out[f.id] = text
        method = v.get("method", "lora")
        out["finetuning_type"] = "lora" if method == "qlora" else method
        if method == "qlora":
            out["quantization_bit"] = 4
        elif "quantization_bit" in out and str(out["quantization_bit"]) == "4":
            out.pop("quantization_bit")
        strategy, offload = v.get("strategy", "single"), bool(v.get("offload"))
        out.pop("fsdp", None)
        if strategy == "fsdp":
            out["fsdp"] = "full_shard auto_wrap" + (" offload" if offload else "")
        out.pop("zero_stage", None)
        out.pop("offload", None)
        if strategy in ("zero2", "zero3"):
            # a DeepSpeed JSON of the user's wins; else the keys cockpit generates its config from
            if not out.get("deepspeed"):
                stage = 3 if strategy == "zero3" else 2
                out["zero_stage"] = stage
                if offload:
                    out["offload"] = ZERO_OFFLOAD[stage]
        elif out.get("deepspeed"):
            out.pop("deepspeed")
        if v.get("precision") == "bf16":
            out["bf16"] = True
        elif v.get("precision") == "fp16":
            out["fp16"] = True
        if v.get("device") == "cpu":
            out["use_cpu"] = True
        elif v.get("device") == "gpu":
            out["use_cpu"] = False
        order = {k: i for i, k in enumerate(SCHEMA)}
        return dict(sorted(out.items(), key=lambda kv: order.get(kv[0], len(order))))

    def typed(self, raw: dict[str, Any] | None = None) -> dict[str, Any]:
        """The raw mapping with values coerced to their schema types where they are valid
        (a preset YAML keeps numbers as numbers, paths as given)."""
        from cockpit.config.load import coerce

        out = {}
        for k, val in (raw if raw is not None else self.raw()).items():
            spec = SCHEMA.get(k)
            try:
                out[k] = coerce(spec, val) if spec is not None else val
            except ValueError:
                out[k] = val
        return out

    def check(self, check_paths: bool = True) -> Checked:
        from cockpit.config.load import validate

        raw = self.raw()
        notes = []
        if (
            self.values.get("strategy") == "ddp"
            and str(raw.get("nproc_per_node", 1)) in ("1", "")
            and str(raw.get("nnodes", 1)) in ("1", "")
        ):
            notes.append("DDP: set GPUs per node > 1 (or nodes > 1); with 1 process it is a single-process run")
        try:
            cfg = validate(raw, check_paths=check_paths)
        except InputError as err:
            return Checked(None, [str(p) for p in err.problems], notes, [p.key for p in err.problems if p.key])
        return Checked(cfg, [], notes + list(cfg.notes))  # validation's notes, as cockpit check says

    # -- fit line -------------------------------------------------------------------------
    def gpu_memory(self) -> float | None:
        """The GPU memory field in GiB; None when empty or not a positive number (the planner picks one)."""
        try:
            value = float(self.values.get("gpu_memory_gb") or 0)
        except ValueError:
            return None
        return value if value > 0 else None

    def yaml(self) -> str:
        from cockpit.config.load import to_yaml

        return to_yaml(self.typed(), only_changed=False)


def fit_line(cfg: RunConfig, machine: Any, gpu_memory_gb: float | None = None, config_path: str | None = None) -> str:
    """One line from the memory planner (pure Python, meta device off: torch-free): ``cockpit plan``'s
    capacity (:func:`cockpit.plan.device_capacity`: the GPU memory field ``gpu_memory_gb``; a CPU run, the
    host's RAM shared by its ranks; ``machine``'s GPUs; the device ``config_path``'s header names) and its
    one verdict (the host-RAM line counted where ``plan`` counts it)."""
    from cockpit.plan import plan

    try:
        res = plan(
            cfg.keys_only(),
            gpu_memory_gb=gpu_memory_gb,
            base_dir=cfg.base_dir,
            use_meta=False,
            gpus_visible=machine.gpus,
            detected_gpu_gb=machine.gpu_memory_gb,
            machine_ram_gb=machine.ram_gb,
            config_path=config_path,
        )
    except InputError as err:
        return "fit: cannot estimate: " + "; ".join(str(p) for p in err.problems)
    except Exception as exc:  # noqa: BLE001 - an unknown model layout must not break the form
        return f"fit: cannot estimate ({type(exc).__name__}: {exc})"
    d = res.as_dict()
    source = d.get("capacity_source") or "the GPU memory field"
    where = "per rank" if source.startswith("host RAM") else "per device"
    v, host = d.get("verdict"), d.get("host") or {}
    line = f"peak {res.estimate.peak / 2**30:.1f} GiB {where}"
    if v:  # as cockpit plan's verdict line words it
        line += f" -> {v['status']} on {res.capacity_gib:.3g} GiB of {source} ({100 * v['headroom']:.0f}% headroom)"
    else:
        line += (
            " -> no verdict: set GPU memory (or name the device in the YAML's first comment line, as the presets do)"
        )
    overall, hv = d.get("overall") or {}, host.get("verdict")
    if hv and "device" not in overall.get("by", ["device"]):  # the host line decides the one verdict: said first
        line = f"{overall['status']} (host RAM at load {host['peak_gib']:.1f} GiB on {host['capacity_gib']:.3g} GiB); {line}"
    line = "fit: " + line
    if res.suggestion and res.suggestion.get("why"):
        line += f"; try: {res.suggestion['why']}"
    return line


def field_for_key(key: str) -> str:
    """The form field that edits a config key (virtual fields own some keys)."""
    return {
        "finetuning_type": "method",
        "quantization_bit": "method",
        "fsdp": "strategy",
        "bf16": "precision",
        "fp16": "precision",
        "use_cpu": "device",
    }.get(key, key)


def group_of(field_id: str) -> str | None:
    for group, fields in GROUPS.items():
        if any(f.id == field_id for f in fields):
            return group
    return None


def data_report(data: Any) -> Any:
    """``cockpit check --json`` output -> a Rich Text (truncation report + first sample preview,
    trained tokens highlighted)."""
    from rich.text import Text

    t = Text()
    if not isinstance(data, dict):
        t.append("data check: no result", style=themed("$text-error"))
        return t
    if not data.get("ok", True):
        t.append("cockpit check found problems:\n", style=themed("bold $text-error"))
        for p in data.get("problems") or []:
            t.append(f"  {p}\n", style=themed("$text-error"))
        return t
    formats = data.get("formats") or {}
    t.append("Data ", style="bold underline")
    t.append(f" {data.get('samples')} samples; " + ", ".join(f"{k} ({v})" for k, v in formats.items()))
    tr = data.get("truncation") or {}
    if tr.get("stage"):  # pt / dpo / kto / rm: the stage's own report (cockpit/data/stage_data.py)
        for line in tr.get("lines") or []:
            t.append("\n" + line, style=themed("bold $text-warning") if line.startswith("warning") else "")
    elif tr:
        t.append(
            f"\ntokens per sample: p50 {tr.get('p50')}  p90 {tr.get('p90')}  p99 {tr.get('p99')}  max {tr.get('max')}"
        )
        style = themed("$text-warning" if tr.get("truncated") else "$text-success")
        t.append(
            f"\ncutoff_len {tr.get('cutoff_len')}: truncates {tr.get('truncated')} samples ({tr.get('truncated_pct', 0):.1f}%), "
            f"loses {tr.get('target_tokens_lost')} of {tr.get('target_tokens')} trained tokens ({tr.get('target_lost_pct', 0):.1f}%)",
            style=style,
        )
        if tr.get("emptied"):
            t.append(
                f"\n{tr['emptied']} samples keep no trained token after truncation: raise cutoff_len",
                style=themed("bold $text-warning"),
            )
    bad = data.get("bad_rows") or []
    for b in bad[:5]:
        t.append(f"\nbad row: {b}", style=themed("$text-warning"))
    if len(bad) > 5:
        t.append(f"\n... {len(bad) - 5} more bad rows", style=themed("$text-warning"))
    for w in data.get("warnings") or []:
        t.append(f"\nwarning: {w}", style=themed("$text-warning"))
    pv = data.get("preview") or {}
    if pv.get("pair"):  # a preference pair: the two answers side by side
        t.append(_pair_table(pv))
    elif pv.get("pieces"):
        t.append(f"\n\nFirst sample ({pv.get('source')}), ", style="bold")
        t.append("trained tokens highlighted", style=themed("$text on $success"))
        t.append(":\n")
        for piece in pv["pieces"]:
            t.append(piece.get("text", ""), style=themed("$text on $success") if piece.get("trained") else "")
    return t


def _pair_table(pv: dict[str, Any], width: int = 36) -> Any:
    """The first preference pair: its prompt, then the chosen and rejected answers side by side
    (two wrapped columns of ``width`` characters)."""
    import textwrap
    from itertools import zip_longest

    from rich.text import Text

    t = Text()
    prompt = "".join(p.get("text", "") for p in pv.get("pieces", []) if not p.get("trained"))
    t.append(f"\nFirst pair ({pv.get('source')}), prompt:\n", style="bold")
    t.append(prompt.strip()[-400:] + "\n")
    left = textwrap.wrap(pv["pair"].get("chosen", ""), width) or [""]
    right = textwrap.wrap(pv["pair"].get("rejected", ""), width) or [""]
    t.append(f"{'chosen':<{width}} | ", style=themed("bold $text-success"))
    t.append("rejected\n", style=themed("bold $text-error"))
    for a, b in zip_longest(left[:12], right[:12], fillvalue=""):
        t.append(f"{a:<{width}}", style=themed("$text-success"))
        t.append(" | ")
        t.append(b + "\n", style=themed("$text-error"))
    return t
