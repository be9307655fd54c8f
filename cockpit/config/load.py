"""Load, override and validate a run config. Errors name the file, line and key.

``load_config(path, overrides)`` is the one code path used by ``cockpit check``, ``cockpit
train`` and the TUI's forms (which call :func:`validate` on their own mapping).
No torch / transformers imports here.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from cockpit.config.lf_v1 import MCORE_KEYS, MCORE_REASON, V1_ONLY, is_v1
from cockpit.config.lf_v1 import note as v1_note
from cockpit.config.lf_v1 import refusal as v1_refusal
from cockpit.config.lf_v1 import translate as v1_translate
from cockpit.config.notes import logging_note
from cockpit.config.parity import parity_problems
from cockpit.config.run_config import RunConfig
from cockpit.config.schema import ALIASES, LLAMAFACTORY_UNSUPPORTED, SCHEMA, Key, default_config, describe
from cockpit.config.stages import stage_problems
from cockpit.errors import InputError, Problem
from cockpit.redact import REDACTED as REDACTED  # re-exported (the UI and the tests take it from here)
from cockpit.redact import SECRET_PATTERNS as SECRET_PATTERNS
from cockpit.redact import is_secret_name as is_secret_name
from cockpit.redact import redact_env
from cockpit.shape import world_size_of

DEMO_PREFIX = "@demo"
DEMO_DIR = Path(__file__).resolve().parent.parent / "demo_data"

# Keys whose values are paths that must exist (resolved to absolute paths).
_INPUT_PATH_KEYS = ("adapter_name_or_path", "deepspeed", "probes", "ref_model_adapters")


# -- YAML with line numbers ------------------------------------------------------------------
class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load, plus an error on duplicate keys (PyYAML silently keeps the last)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key]})", key_node.start_mark
            )
        try:
            seen[key] = key_node.start_mark.line + 1
        except TypeError:  # unhashable key
            pass
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, int]]:
    """Read a YAML mapping; returns (data, key -> line). Raises InputError naming file:line."""
    p = Path(path)
    name = str(path)
    if not p.exists():
        raise InputError(Problem("no such file", file=name))
    if p.is_dir():
        raise InputError(Problem("is a directory, expected a YAML file", file=name))
    raw = p.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise InputError(Problem(f"not UTF-8 (byte 0x{raw[exc.start]:02x})", file=name, line=line)) from None
    return parse_yaml_text(text, name)


def parse_yaml_text(text: str, name: str = "<config>") -> tuple[dict[str, Any], dict[str, int]]:
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark or exc.context_mark
        msg = exc.problem or str(exc)
        if "could not determine a constructor" in msg:
            tag = re.search(r"tag '?([^'\s]+)'?", msg)
            shown = tag.group(1).replace("tag:yaml.org,2002:", "!!") if tag else "?"
            msg = f"tag {shown} refused (only plain YAML is read, never Python objects)"
        raise InputError(Problem(msg, file=name, line=(mark.line + 1) if mark else None)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(
            Problem(f"invalid YAML: {problem}", file=name, line=(mark.line + 1) if mark else None)
        ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(
            Problem(f"expected a mapping of key: value at the top level, got {type(data).__name__}", file=name, line=1)
        )
    lines: dict[str, int] = {}
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        if isinstance(node, yaml.MappingNode):
            for key_node, _ in node.value:
                lines[str(key_node.value)] = key_node.start_mark.line + 1
    except yaml.YAMLError:
        pass
    return {str(k): v for k, v in data.items()}, lines


# -- values ---------------------------------------------------------------------------------
_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def coerce(key: Key, value: Any) -> Any:
    """Coerce a value to the key's type; raises ValueError with the allowed values."""
    nulls = {"null", "~"} if (key.choices and "none" in key.choices) else {"null", "none", "~"}
    if value is None or (isinstance(value, str) and value.strip().lower() in nulls and key.type != "str"):
        if key.nullable:
            return None
        raise ValueError(f"must be {describe(key)}, not null")
    t = key.type
    if t == "names":
        return _names(key, value)
    if t == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise ValueError(f"must be true | false, got {value!r}")
    if t == "int" or (t == "choice" and key.choices and all(isinstance(c, int) for c in key.choices)):
        if isinstance(value, bool):
            raise ValueError(f"must be {describe(key)}, got {value!r}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise ValueError(f"must be {describe(key)}, got {value!r}") from None
        if not isinstance(value, int):
            raise ValueError(f"must be {describe(key)}, got {value!r}")
    elif t == "float":
        if isinstance(value, bool):
            raise ValueError(f"must be {describe(key)}, got {value!r}")
        if isinstance(value, str):
            try:
                value = float(value.strip())  # YAML 1.1 reads 1e-4 as a string
            except ValueError:
                raise ValueError(f"must be {describe(key)}, got {value!r}") from None
        if not isinstance(value, (int, float)):
            raise ValueError(f"must be {describe(key)}, got {value!r}")
        value = float(value)
        if value != value:
            raise ValueError("must be a number, got nan")
    elif t == "str":
        if isinstance(value, bool) or isinstance(value, (dict, list)):
            raise ValueError(f"must be a string, got {type(value).__name__} {value!r}")
        value = str(value)
    elif t == "map":
        if not isinstance(value, dict):
            raise ValueError(f"must be a mapping of NAME: value, got {type(value).__name__}")
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise ValueError(f"{k!r} is not a valid environment variable name")
            if isinstance(v, (dict, list)) or v is None:
                raise ValueError(f"{k}: must be a string or number")
            out[k] = str(v).lower() if isinstance(v, bool) else str(v)
        value = out
    elif t == "dict":
        if isinstance(value, str):  # a flag or --set value: YAML / JSON text
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError:
                pass
        if not isinstance(value, dict):
            raise ValueError(f"must be a mapping, got {type(value).__name__} {value!r}")
    if key.choices is not None:
        if isinstance(value, str):
            match = [c for c in key.choices if str(c).lower() == value.strip().lower()]
            value = match[0] if match else value
        if value not in key.choices:
            raise ValueError(f"must be one of {describe(key)}, got {value!r}")
    if t in ("int", "float") and isinstance(value, (int, float)):
        if key.min is not None and (value < key.min or (key.min_exclusive and value == key.min)):
            raise ValueError(f"must be {describe(key)}, got {value!r}")
        if key.max is not None and value > key.max:
            raise ValueError(f"must be {describe(key)}, got {value!r}")
    return value


def _names(key: Key, value: Any) -> str:
    """A ``names`` key (report_to): one name, a comma string or a YAML list of the key's choices ->
    the names as a comma string in the order given (``none`` alone for none; an empty list is none)."""
    if isinstance(value, str):  # a --set value: `wandb,mlflow` or `[wandb, mlflow]`
        value = value.strip().removeprefix("[").removesuffix("]").split(",")
    items = value if isinstance(value, list) else None
    if items is None or not all(isinstance(i, str) for i in items):
        raise ValueError(f"must be {describe(key)}, got {value!r}")
    names = list(dict.fromkeys(i.strip().lower() for i in items if i.strip())) or ["none"]
    assert key.choices is not None, f"{key.name}: a names key lists its choices"  # the schema's names keys do
    unknown = [n for n in names if n not in key.choices]
    if unknown:
        hint = " ('all' is not taken: name the trackers)" if "all" in unknown else ""
        raise ValueError(f"must be {describe(key)}, got {', '.join(unknown)}{hint}")
    if "none" in names and len(names) > 1:
        raise ValueError(f"none with other names ({', '.join(n for n in names if n != 'none')}): keep one or the other")
    return ",".join(names)


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """``--set key=value`` items -> mapping (values are YAML scalars, typed later by the schema)."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise InputError(Problem(f"--set expects key=value, got {item!r}", key=item))
        key, _, raw = item.partition("=")
        key = key.strip()
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError:
            value = raw
        if isinstance(value, (dict, list)) and key != "env":
            value = raw
        out[key] = value
    return out


def _unknown_key_problem(key: str, file: str | None, line: int | None) -> Problem:
    if key in LLAMAFACTORY_UNSUPPORTED:
        from cockpit.config.parity import refusal_reason

        why = refusal_reason(key) or "not supported yet"
        return Problem(f"a LLaMA-Factory key that Cockpit refuses: {why}; remove it", file=file, line=line, key=key)
    if key in MCORE_KEYS:
        return Problem(f"{MCORE_REASON}; remove it", file=file, line=line, key=key)
    close = difflib.get_close_matches(key, list(SCHEMA), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return Problem(f"unknown key{hint}", file=file, line=line, key=key)


def _resolve_existing(value: str, base_dirs: list[Path]) -> Path | None:
    if value.startswith(DEMO_PREFIX):
        rest = value[len(DEMO_PREFIX) :].lstrip("/")
        p = DEMO_DIR / rest
        return p if p.exists() else None
    p = Path(value).expanduser()
    if p.is_absolute():
        return p if p.exists() else None
    for base in base_dirs:
        cand = base / p
        if cand.exists():
            return cand.resolve()
    return None


def validate(
    raw: Mapping[str, Any],
    *,
    file: str | None = None,
    lines: Mapping[str, int | None] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
    check_paths: bool = True,
    for_plan: bool = False,
) -> RunConfig:
    """Validate a raw mapping; returns the resolved, typed config (every key). Collects all problems.
    ``for_plan``: the config of a plan, possibly for another machine: it may name no dataset (a plan
    reads no data), and the packages it needs are not looked up here."""
    key_lines: Mapping[str, int | None] = lines or {}
    problems: list[Problem] = []
    if isinstance(raw, RunConfig):  # validated before: its values, not its `_base_dir` / `_notes`
        raw = raw.keys_only()

    def where(key: str) -> dict[str, Any]:
        return {"file": file, "line": key_lines.get(key), "key": key}

    notes: list[str] = []
    bases = [Path.cwd()] + ([Path(base_dir).resolve()] if base_dir is not None else [])
    if is_v1(raw):
        raw, key_lines = _read_v1(raw, key_lines, file, bases, notes)
    raw = _resolve_aliases(raw, problems, where, notes)
    cfg = _typed_values(raw, problems, where, file, key_lines)
    if "do_train" not in raw and cfg.get("do_predict") and cfg.get("eval_dataset") and not cfg.get("dataset"):
        # LLaMA-Factory's predict examples leave do_train out (HF's default: false) and name eval_dataset alone
        cfg["do_train"] = False
        notes.append(
            "do_train: false (do_predict with eval_dataset and no dataset: a prediction-only run, as in "
            "LLaMA-Factory, where do_train defaults to false)"
        )
    problems.extend(_cross_key_problems(cfg, where, needs_data=not for_plan))
    problems.extend(_strategy_problems(raw, cfg, where, problems))
    problems.extend(stage_problems(cfg, where))
    problems.extend(parity_problems(raw, cfg, where, (lambda name: True) if for_plan else None))
    # paths: read as given, resolved against the working dir then the config's dir
    if check_paths:
        problems.extend(_resolve_paths(cfg, bases, where))
    cfg["_base_dir"] = str(bases[-1])
    note = logging_note(cfg)
    cfg["_notes"] = notes + ([note] if note else [])
    if check_paths and not problems and (cfg.get("deepspeed") or cfg.get("zero_stage")):
        problems.extend(_deepspeed_problems(cfg, full=False))
    if problems:
        raise InputError(problems)
    return RunConfig.from_mapping(cfg)


def _read_v1(
    raw: Mapping[str, Any], lines: Mapping[str, int | None], file: str | None, bases: list[Path], notes: list[str]
) -> tuple[dict[str, Any], dict[str, int]]:
    """A LLaMA-Factory v1 file as v0 keys (each at its v1 key's line), with a note; InputError with the table
    of v0 keys when a key has no exact v0 form (one problem, never the v1 keys as unknown keys)."""
    out, origin, why_not = v1_translate(raw, bases)
    known = {k: n for k, n in lines.items() if n}  # the keys with a line in the file
    if why_not:
        first = min((known[k] for k in raw if k in V1_ONLY and k in known), default=None)
        raise InputError(Problem(v1_refusal(raw, why_not), file=file, line=first))
    notes.append(v1_note(raw, out, origin))
    return out, {k: known[o] for k, o in origin.items() if o and o in known}


def _typed_values(
    raw: Mapping[str, Any], problems: list[Problem], where: Any, file: str | None, lines: Mapping[str, int | None]
) -> dict[str, Any]:
    """The defaults with every known key's value coerced to its schema type; unknown keys and
    values of the wrong type are problems."""
    cfg = default_config()
    for key, value in raw.items():
        spec = SCHEMA.get(key)
        if spec is None:
            problems.append(_unknown_key_problem(key, file, lines.get(key)))
            continue
        try:
            cfg[key] = coerce(spec, value)
        except ValueError as exc:
            problems.append(Problem(str(exc), **where(key)))
    return cfg


def _cross_key_problems(cfg: dict[str, Any], where: Any, needs_data: bool = True) -> list[Problem]:
    """Rules between keys (and ``lora_alpha``'s default, twice the rank)."""
    problems = []
    if (
        needs_data and not cfg.get("dataset") and cfg["do_train"]
    ):  # a prediction-only run may name eval_dataset alone (parity.py)
        problems.append(Problem("required: a .json/.jsonl file or dataset names", **where("dataset")))
    if cfg["ignore_pad_token_for_loss"] is False:
        problems.append(
            Problem(
                "padding never carries the loss here; ignore_pad_token_for_loss must be true",
                **where("ignore_pad_token_for_loss"),
            )
        )
    if cfg["bf16"] and cfg["fp16"]:
        problems.append(Problem("bf16 and fp16 are both true; choose one precision", **where("fp16")))
    if cfg["deepspeed"] and cfg["fsdp"]:
        problems.append(Problem("deepspeed and fsdp are both set; choose one strategy", **where("fsdp")))
    if cfg["quantization_bit"] is not None and cfg["finetuning_type"] != "lora":
        problems.append(
            Problem(
                f"quantization_bit needs finetuning_type: lora (QLoRA), got {cfg['finetuning_type']}",
                **where("quantization_bit"),
            )
        )
    gres = cfg.get("slurm_gres")
    if gres is not None and not re.fullmatch(r"[A-Za-z0-9_.:/\-]+", str(gres)):
        problems.append(
            Problem(f"a GRES name like gpu:mi300x (letters, digits, _ . : / -), got {gres!r}", **where("slurm_gres"))
        )
    if cfg["node_rank"] >= cfg["nnodes"]:
        problems.append(Problem(f"node_rank {cfg['node_rank']} must be < nnodes {cfg['nnodes']}", **where("node_rank")))
    if isinstance(cfg["val_size"], float) and cfg["val_size"] >= 1 and not cfg["val_size"].is_integer():
        problems.append(Problem("val_size must be a fraction < 1 or a whole count", **where("val_size")))
    target = cfg["lora_target"]
    if target != "all" and not all(re.fullmatch(r"[A-Za-z0-9_.*]+", t.strip()) for t in target.split(",")):
        problems.append(
            Problem(f"expected 'all' or a comma list of module names, got {target!r}", **where("lora_target"))
        )
    if cfg["lora_alpha"] is None:
        cfg["lora_alpha"] = 2 * cfg["lora_rank"]
    if cfg["fsdp"] is not None:
        opts = cfg["fsdp"].split()
        allowed = {"full_shard", "shard_grad_op", "hybrid_shard", "no_shard", "offload", "auto_wrap"}
        bad = [o for o in opts if o not in allowed]
        if bad or not opts:
            problems.append(
                Problem(f"unknown fsdp option(s) {bad or opts}; allowed: {' '.join(sorted(allowed))}", **where("fsdp"))
            )
    return problems


def _resolve_paths(cfg: dict[str, Any], bases: list[Path], where: Any) -> list[Problem]:
    """Every relative path made absolute once, where the command runs, so the ranks (working in the
    run dir) read what ``cockpit check`` read: input files and folders (each must exist), an unset
    ``dataset_dir`` as the ``data`` folder found, dataset files, local models; ``output_dir``, ``swanlab_logdir`` and
    ``tokenized_path`` against the working dir."""
    problems = []
    for key in _INPUT_PATH_KEYS:
        value = cfg.get(key)
        if not value:
            continue
        found = _resolve_existing(value, bases)
        if found is None:
            problems.append(Problem(f"no such file or folder: {value}", **where(key)))
        else:
            if key in ("deepspeed", "probes") and found.is_dir():
                problems.append(Problem(f"is a directory, expected a file: {value}", **where(key)))
            cfg[key] = str(found)
    for key, what in (
        ("dataset_dir", "folder"),
        ("media_dir", "folder"),
        ("resume_from_checkpoint", "checkpoint folder"),
    ):
        value = cfg[key]
        if not value or (key == "resume_from_checkpoint" and value in ("last", "true", "True")):
            continue
        found = _resolve_existing(value, bases)
        if found is None or not found.is_dir():
            problems.append(Problem(f"no such {what}: {value}", **where(key)))
        else:
            cfg[key] = str(found)
    if not cfg["dataset_dir"]:  # LLaMA-Factory's default `data`: where the command runs, not the run dir
        found_dir = _default_dataset_dir(cfg, bases)
        cfg["dataset_dir"] = str(found_dir) if found_dir else None
    for key in ("dataset", "eval_dataset"):  # a file (a name list is looked up in dataset_dir)
        value = cfg.get(key)
        if value and _is_dataset_file(value) and not value.startswith(DEMO_PREFIX):
            found = _resolve_existing(value.strip(), bases)
            cfg[key] = str(found) if found is not None else value  # a missing file: the data check names it
    for key in ("model_name_or_path", "ref_model"):  # a local folder or file; else a name or hub id
        local = _resolve_existing(cfg[key], bases) if cfg.get(key) else None
        if local is not None:
            cfg[key] = str(local)
    if cfg.get("reward_funcs"):  # grpo: a user's path/file.py:function, made absolute; the function found (parsed)
        problems += _resolve_reward_files(cfg, bases, where)
    for key in ("output_dir", "tokenized_path", "swanlab_logdir"):  # made by the run: against the working dir
        if cfg[key]:
            cfg[key] = str((Path.cwd() / Path(cfg[key]).expanduser()).resolve())
    return problems


def _resolve_reward_files(cfg: dict[str, Any], bases: list[Path], where: Any) -> list[Problem]:
    from cockpit.config.grpo import function_defined, reward_names, user_reward

    problems, names = [], []
    for name in reward_names(cfg["reward_funcs"]):
        parsed = user_reward(name)
        if parsed is None:
            names.append(name)
            continue
        found = _resolve_existing(parsed[0], bases)
        if found is None or not found.is_file():
            problems.append(Problem(f"reward file not found: {parsed[0]} (in {name})", **where("reward_funcs")))
            names.append(name)
            continue
        why = function_defined(found, parsed[1])
        if why:
            problems.append(Problem(why, **where("reward_funcs")))
        names.append(f"{found}:{parsed[1]}")
    cfg["reward_funcs"] = ",".join(names)
    return problems


def _is_dataset_file(value: str) -> bool:
    """A ``dataset`` value naming one file rather than names in dataset_info.json (as
    :func:`cockpit.data.dataset_info.resolve_datasets` reads it)."""
    value = value.strip()
    return value.endswith((".json", ".jsonl")) or "/" in value or value.startswith(DEMO_PREFIX)


def _default_dataset_dir(cfg: Mapping[str, Any], bases: list[Path]) -> Path | None:
    """The ``data`` folder (with a dataset_info.json) that an unset ``dataset_dir`` means: under the
    working dir, else under the config's dir; of two, the first that lists every dataset name."""
    found: list[Path] = []
    for base in bases:
        d = (base / "data").resolve()
        if (d / "dataset_info.json").is_file() and d not in found:
            found.append(d)
    names = {
        n.strip()
        for key in ("dataset", "eval_dataset")
        if cfg.get(key) and not _is_dataset_file(cfg[key])
        for n in str(cfg[key]).split(",")
        if n.strip()
    }
    for d in found:
        try:
            listed = json.loads((d / "dataset_info.json").read_text(encoding="utf-8-sig"))
        except (OSError, ValueError):
            continue  # the data check reports the broken file
        if isinstance(listed, dict) and names <= set(listed):
            return d
    return found[0] if found else None


def _resolve_aliases(raw: Mapping[str, Any], problems: list[Problem], where: Any, notes: list[str]) -> dict[str, Any]:
    """``lora_target_modules`` -> ``lora_target`` (one note each); both spellings given is a problem."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        target = ALIASES.get(key)
        if target is None:
            out.setdefault(key, value)
            continue
        if target in raw:
            problems.append(Problem(f"is another spelling of {target}, which is set too; keep one", **where(key)))
            continue
        notes.append(f"{key} is read as {target} (the spelling LLaMA-Factory guides use for it)")
        out[target] = value
    return out


def _strategy_problems(
    raw: Mapping[str, Any], cfg: dict[str, Any], where: Any, problems: list[Problem]
) -> list[Problem]:
    """Cross-key rules of the strategy keys (zero_stage, offload, numa_bind, multi-node, fsdp)."""
    from cockpit.strategy.numa import check_value

    out: list[Problem] = []
    if raw.get("numa_bind") is False:  # YAML 1.1 reads a bare `off` as false
        problems[:] = [p for p in problems if p.key != "numa_bind"]
        cfg["numa_bind"] = "off"
    msg = check_value(cfg.get("numa_bind"), int(cfg["nproc_per_node"]))
    if msg:
        out.append(Problem(f"{msg} (auto | off | a quoted map like '0:0,1:0,2:1')", **where("numa_bind")))
    if cfg.get("zero_stage") and cfg.get("deepspeed"):
        out.append(
            Problem(
                "zero_stage generates a DeepSpeed config, and deepspeed names one too; choose one",
                **where("zero_stage"),
            )
        )
    if cfg.get("zero_stage") and cfg.get("fsdp"):
        out.append(Problem("zero_stage (DeepSpeed) and fsdp are both set; choose one strategy", **where("fsdp")))
    if cfg.get("offload", "none") != "none" and not cfg.get("zero_stage"):
        hint = (
            " (for a deepspeed file, set offload in the file; for fsdp, add 'offload' to fsdp)"
            if (cfg.get("deepspeed") or cfg.get("fsdp"))
            else ""
        )
        out.append(
            Problem(
                f"offload applies to a generated DeepSpeed config: set zero_stage: 2 or 3{hint}", **where("offload")
            )
        )
    if cfg.get("offload") == "optimizer+params" and cfg.get("zero_stage") == 2:
        out.append(
            Problem("parameter offload needs zero_stage: 3 (ZeRO-2 offloads the optimizer only)", **where("offload"))
        )
    if int(cfg["nnodes"]) > 1 and not int(cfg["master_port"] or 0):
        out.append(
            Problem(
                "several nodes need a fixed master_port that every node uses (0 picks a free port on one machine only)",
                **where("master_port"),
            )
        )
    if cfg.get("fsdp"):
        opts = set(str(cfg["fsdp"]).split())
        if world_size_of(cfg) < 2:
            out.append(
                Problem("FSDP shards over several processes; set nproc_per_node (or nnodes) above 1", **where("fsdp"))
            )
        if "no_shard" in opts:
            out.append(Problem("no_shard is plain data parallel: unset fsdp to train with DDP", **where("fsdp")))
        if {"full_shard", "shard_grad_op"} <= opts:
            out.append(Problem("full_shard and shard_grad_op are both given; choose one", **where("fsdp")))
        if cfg.get("quantization_bit"):
            out.append(
                Problem(
                    "FSDP with a quantized (QLoRA) base is not supported: FSDP2's fully_shard would split "
                    "bitsandbytes' packed weights from their quantization state (LLaMA-Factory's fsdp_qlora example "
                    "needs FSDP1 and bnb_4bit_quant_storage); unset fsdp to train QLoRA with DDP (each rank holds the "
                    "4-bit base), or unset quantization_bit",
                    **where("fsdp"),
                )
            )
    return out


def _deepspeed_problems(cfg: Mapping[str, Any], *, full: bool) -> list[Problem]:
    """The DeepSpeed config against the run: pure checks (validate: the TUI's forms too), and with
    ``full`` DeepSpeed's own parser after HF's "auto" filling, in a child process (load_config: the CLI)."""
    from cockpit.strategy import deepspeed as ds

    try:
        data, name = ds.source(cfg)
    except InputError as err:
        return list(err.problems)
    found = ds.check(data or {}, cfg, name or "<deepspeed>")
    return found or (ds.validate_in_subprocess(cfg) if full else [])


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: Mapping[str, Any] | Iterable[str] | None = None,
    *,
    check_paths: bool = True,
    flags: Iterable[Any] = (),
) -> RunConfig:
    """Read a YAML config, apply LLaMA-Factory-style ``flags`` (:mod:`cockpit.config.flags`), then
    ``--set`` overrides, validate; returns the resolved config. Problems from a flag name the flag."""
    from cockpit.config.flags import flags_to_overrides, name_flags

    flags = list(flags)
    raw: dict[str, Any] = {}
    lines: dict[str, int | None] = {}  # None: a flag or --set, no line in the file
    base_dir = None
    if path is not None:
        raw, yaml_lines = read_yaml(path)
        lines.update(yaml_lines)
        base_dir = Path(path).resolve().parent
    flag_values, _ = flags_to_overrides(flags)
    ov = {} if not overrides else dict(overrides) if isinstance(overrides, Mapping) else parse_overrides(overrides)
    for key, value in [*flag_values.items(), *ov.items()]:
        for other in [k for k in raw if k != key and ALIASES.get(k, k) == ALIASES.get(key, key)]:
            del raw[other]  # a flag or --set overrides the YAML's key under either spelling
        raw[key] = value
        lines[key] = None
    file = str(path) if path is not None else None
    try:
        cfg = validate(raw, file=file, lines=lines, base_dir=base_dir, check_paths=check_paths)
        if check_paths and (cfg.deepspeed or cfg.zero_stage):
            found = _deepspeed_problems(cfg.mapping(), full=True)  # DeepSpeed's own parser (a child process, ~10 s)
            if found:
                raise InputError(found)
        return cfg
    except InputError as err:
        for p in err.problems:  # overrides: say so instead of a line number
            if p.key and p.line is None and p.key in ov:
                p.file = "--set"
        name_flags(err.problems, flags, skip=ov)
        raise InputError(err.problems) from None


def dump_resolved(cfg: RunConfig | Mapping[str, Any]) -> str:
    """The resolved config as YAML (secrets in env redacted; internal keys dropped)."""
    flat = cfg.keys_only() if isinstance(cfg, RunConfig) else cfg
    out = {k: v for k, v in flat.items() if not k.startswith("_")}
    out["env"] = redact_env(out.get("env"))
    return yaml.safe_dump(out, sort_keys=False, allow_unicode=True)


def to_yaml(cfg: RunConfig | Mapping[str, Any], *, only_changed: bool = True) -> str:
    """A config a user can save as a preset: keys that differ from the defaults."""
    defaults = default_config()
    flat = cfg.keys_only() if isinstance(cfg, RunConfig) else cfg
    out = {
        k: v
        for k, v in flat.items()
        if not k.startswith("_")
        and (not only_changed or v != defaults.get(k) or k in ("model_name_or_path", "dataset"))
    }
    return yaml.safe_dump(out, sort_keys=False, allow_unicode=True)
