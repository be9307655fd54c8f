"""DeepSpeed configs: generated from the run config, or the user's own file checked against the run.

- :func:`generate` builds a ZeRO-2/3 config from ``zero_stage`` / ``offload`` and the precision
  (``communication_data_type`` matched to bf16 / fp16 / fp32), with ``"auto"`` wherever HF
  Trainer fills the value (batch sizes, clipping, precision flags, hidden-size buckets).
- :func:`check_file` reads a user's JSON (LLaMA-Factory's ``ds_z*_config.json`` load) and
  checks it against the run: top-level keys DeepSpeed knows (DeepSpeed itself ignores unknown
  ones silently), precision, micro-batch / accumulation / global batch, ZeRO stage and offload
  values. Pure Python (used by config validation, no torch).
- :func:`effective` fills the ``"auto"`` values with HF's own ``HfTrainerDeepSpeedConfig``
  (process + finalize, as Trainer does) and validates the result with DeepSpeed's own
  ``deepspeed.runtime.config.DeepSpeedConfig`` at the run's world size. Imports transformers
  and deepspeed; run it in the ranks, or through ``python -m cockpit.strategy.deepspeed``.

Every problem is a :class:`cockpit.errors.Problem` naming the file and the key.

``raw`` is the run config as a flat mapping of schema keys: the loader's dict before a ``RunConfig``
exists (``config.load.validate``), a ``RunConfig.keys_only()`` (the ranks, ``cockpit preview``), or its
JSON in the child process. This module sits below ``cockpit.config`` and never sees the type.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from cockpit.errors import InputError, Problem
from cockpit.shape import PRECISIONS, precision_of, world_size_of

# Top-level keys DeepSpeed 0.19 reads (each is a quoted key in DeepSpeed's source: pinned by
# tests/test_strategy_deepspeed.py). DeepSpeed ignores any other top-level key silently.
KNOWN_TOP_LEVEL = frozenset(
    """
    train_batch_size train_micro_batch_size_per_gpu gradient_accumulation_steps optimizer scheduler
    fp16 bf16 bfloat16 amp torch_autocast gradient_clipping prescale_gradients gradient_predivide_factor
    sparse_gradients zero_optimization zero_allow_untested_optimizer zero_force_ds_cpu_optimizer
    communication_data_type seq_parallel_communication_data_type steps_per_print wall_clock_breakdown
    memory_breakdown dump_state disable_allgather flops_profiler activation_checkpointing aio autotuning
    tensorboard wandb csv_monitor comet comms_logger elasticity data_efficiency curriculum_learning
    data_types checkpoint compression_training hybrid_engine pipeline sparse_attention weight_quantization
    compile timers tensor_parallel expert_parallel nebula quantize_training eigenvalue progressive_layer_drop
    dataloader_drop_last gradient_allreduce_op managed_gradient_accumulation disable_python_gc log_level
    datastates_ckpt sequence_parallel_size zenflow graph_harvesting moe vocabulary_size
    """.split()
)
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


precision = precision_of  # cockpit.shape's, under the names this module's callers use
world_size = world_size_of


def generate(raw: Mapping[str, Any], *, use_cpu: bool | None = None) -> dict[str, Any]:
    """A ZeRO config for ``zero_stage`` (2 | 3) and ``offload`` (none | optimizer | optimizer+params)."""
    stage = int(raw.get("zero_stage") or 2)
    offload = raw.get("offload") or "none"
    prec = precision(raw)
    cpu = bool(raw.get("use_cpu")) if use_cpu is None else use_cpu
    zero: dict[str, Any] = {
        "stage": stage,
        # overlapping reduction with backward needs device streams; the CPU accelerator has none
        "overlap_comm": not cpu,
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "reduce_bucket_size": "auto",  # HF: hidden_size^2
    }
    if stage == 2:
        zero["allgather_partitions"] = True
        zero["allgather_bucket_size"] = int(5e8)
    else:
        zero.update(
            {
                "sub_group_size": int(1e9),
                "stage3_prefetch_bucket_size": "auto",  # HF: 0.9 * hidden_size^2
                "stage3_param_persistence_threshold": "auto",  # HF: 10 * hidden_size
                "stage3_max_live_parameters": int(1e9),
                "stage3_max_reuse_distance": int(1e9),
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
    if offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": not cpu}
    if offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": not cpu}
    out: dict[str, Any] = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "communication_data_type": prec,
        "bf16": {"enabled": "auto"},
        "fp16": {
            "enabled": "auto",
            "loss_scale": 0,
            "loss_scale_window": 1000,
            "initial_scale_power": 16,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        "zero_optimization": zero,
        "steps_per_print": 10**9,  # the cockpit logs steps; keep DeepSpeed quiet
        "wall_clock_breakdown": False,
    }
    return out


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A user's DeepSpeed JSON; InputError with file:line on a syntax error."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(Problem(f"cannot read: {exc.strerror or exc}", file=name)) from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise InputError(Problem(f"invalid JSON: {exc.msg}", file=name, line=exc.lineno)) from None
    except ValueError as exc:
        raise InputError(Problem(str(exc), file=name)) from None
    if not isinstance(data, dict):
        raise InputError(
            Problem(f"expected a JSON object at the top level, got {type(data).__name__}", file=name, line=1)
        )
    return data


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _get(d: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = d
    for part in dotted.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    return None


def check(ds: Mapping[str, Any], raw: Mapping[str, Any], file: str) -> list[Problem]:
    """Problems of a DeepSpeed config against the run (pure; no DeepSpeed import)."""
    found = [
        *_unknown_top_level_keys(ds),
        *_precision_mismatches(ds, raw),
        *_batch_mismatches(ds, raw),
        *_clipping_mismatches(ds, raw),
        *_zero_problems(ds),
    ]
    if raw.get("fsdp"):
        found.append(("deepspeed", "fsdp is set too; choose one strategy"))
    return [Problem(msg, file=file, key=key) for key, msg in found]


_Finding = tuple[str, str]  # (the key in the DeepSpeed config, the message)


def _unknown_top_level_keys(ds: Mapping[str, Any]) -> list[_Finding]:
    """Top-level keys DeepSpeed does not read (it would ignore them silently), with a close match."""
    found: list[_Finding] = []
    for key in ds:
        if key not in KNOWN_TOP_LEVEL:
            close = difflib.get_close_matches(key, sorted(KNOWN_TOP_LEVEL), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            found.append((key, f"not a DeepSpeed key{hint}; DeepSpeed would ignore it silently"))
    return found


def _precision_mismatches(ds: Mapping[str, Any], raw: Mapping[str, Any]) -> list[_Finding]:
    """bf16 / fp16 flags and communication_data_type that disagree with the run's precision."""
    found: list[_Finding] = []
    prec = precision(raw)
    for name, flag in (("bf16", "bf16"), ("fp16", "fp16")):
        enabled = _get(ds, f"{name}.enabled")
        if enabled is None and name == "bf16":
            enabled = _get(ds, "bfloat16.enabled")
        if enabled == "auto" or enabled is None:
            continue
        if bool(enabled) != bool(raw.get(flag)):
            found.append(
                (
                    f"{name}.enabled",
                    f'is {str(bool(enabled)).lower()} but the run has {flag}: {str(bool(raw.get(flag))).lower()}; set it to "auto" or change {flag}',
                )
            )
    comm = ds.get("communication_data_type")
    if comm is not None and comm != "auto":
        if comm not in PRECISIONS:
            found.append(("communication_data_type", f"must be one of {' | '.join(PRECISIONS)}, got {comm!r}"))
        elif prec != "fp32" and comm not in (prec, "fp32"):
            found.append(("communication_data_type", f"is {comm} but the run trains in {prec}; use {prec} or fp32"))
        elif prec == "fp32" and comm != "fp32":
            found.append(
                ("communication_data_type", f'is {comm} but the run trains in fp32 (no bf16/fp16); use fp32 or "auto"')
            )
    return found


def _batch_mismatches(ds: Mapping[str, Any], raw: Mapping[str, Any]) -> list[_Finding]:
    """Micro-batch, accumulation and global batch sizes that are not the run's batch arithmetic."""
    found: list[_Finding] = []
    micro, gas, ws = int(raw["per_device_train_batch_size"]), int(raw["gradient_accumulation_steps"]), world_size(raw)
    for key, want, ours in (
        ("train_micro_batch_size_per_gpu", micro, "per_device_train_batch_size"),
        ("gradient_accumulation_steps", gas, "gradient_accumulation_steps"),
        (
            "train_batch_size",
            micro * gas * ws,
            f"per_device_train_batch_size x gradient_accumulation_steps x world size ({micro} x {gas} x {ws})",
        ),
    ):
        v = ds.get(key)
        if v is None or v == "auto":
            continue
        n = _num(v)
        if n is None or n != int(n) or n < 1:
            found.append((key, f'must be a positive integer or "auto", got {v!r}'))
        elif int(n) != want:
            found.append((key, f'is {int(n)} but the run has {ours} = {want}; set it to "auto" or make them agree'))
    return found


def _clipping_mismatches(ds: Mapping[str, Any], raw: Mapping[str, Any]) -> list[_Finding]:
    """gradient_clipping that is not a number, or not the run's max_grad_norm."""
    clip = ds.get("gradient_clipping")
    if clip in (None, "auto"):
        return []
    if _num(clip) is None:
        return [("gradient_clipping", f'must be a number or "auto", got {clip!r}')]
    if float(clip) != float(raw.get("max_grad_norm") or 0.0):
        return [
            (
                "gradient_clipping",
                f'is {clip} but the run has max_grad_norm: {raw.get("max_grad_norm")}; set it to "auto"',
            )
        ]
    return []


def _zero_problems(ds: Mapping[str, Any]) -> list[_Finding]:
    """zero_optimization's shape, stage and offload devices (parameter offload needs stage 3)."""
    zero = ds.get("zero_optimization")
    if zero is None:
        return []
    if not isinstance(zero, Mapping):
        return [("zero_optimization", f"must be an object, got {type(zero).__name__}")]
    found: list[_Finding] = []
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        found.append(("zero_optimization.stage", f"must be 0 | 1 | 2 | 3, got {stage!r}"))
    for sub in ("offload_optimizer", "offload_param"):
        node = zero.get(sub)
        if node is None:
            continue
        dev = node.get("device") if isinstance(node, Mapping) else None
        if dev not in OFFLOAD_DEVICES:
            found.append(
                (f"zero_optimization.{sub}.device", f"must be one of {' | '.join(OFFLOAD_DEVICES)}, got {dev!r}")
            )
        elif sub == "offload_param" and dev != "none" and stage != 3:
            found.append(
                ("zero_optimization.offload_param", f"parameter offload needs ZeRO stage 3, the file has stage {stage}")
            )
    return found


# -- the full parse: HF fills "auto", DeepSpeed validates ------------------------------------
def _hf_args(raw: Mapping[str, Any], ws: int) -> SimpleNamespace:
    warmup_steps = int(raw.get("warmup_steps") or 0)
    ratio = float(raw.get("warmup_ratio") or 0.0)
    return SimpleNamespace(
        world_size=ws,
        per_device_train_batch_size=int(raw["per_device_train_batch_size"]),
        gradient_accumulation_steps=int(raw["gradient_accumulation_steps"]),
        max_grad_norm=float(raw.get("max_grad_norm") or 0.0),
        learning_rate=float(raw["learning_rate"]),
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=float(raw.get("weight_decay") or 0.0),
        save_on_each_node=False,
        fp16=bool(raw.get("fp16")),
        fp16_full_eval=False,
        bf16=bool(raw.get("bf16")),
        bf16_full_eval=False,
        get_warmup_steps=lambda n: warmup_steps if warmup_steps > 0 else math.ceil(n * ratio),
    )


def effective(
    ds: Mapping[str, Any],
    raw: Mapping[str, Any],
    *,
    file: str,
    hidden_size: int | None = None,
    num_training_steps: int | None = None,
    ws: int | None = None,
) -> dict[str, Any]:
    """The config with every "auto" filled as HF Trainer fills it, validated by DeepSpeed.

    Raises InputError naming the file and key on any problem.
    """
    import copy
    from unittest import mock

    problems = check(ds, raw, file)
    if problems:
        raise InputError(problems)
    try:
        import deepspeed.runtime.config as ds_config_mod
    except ImportError:
        raise InputError(
            Problem("DeepSpeed is not installed here (pip install deepspeed)", file=file, key="deepspeed")
        ) from None
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    ws = ws or world_size(raw)
    data = copy.deepcopy(dict(ds))
    hf = HfTrainerDeepSpeedConfig(data)
    args = _hf_args(raw, ws)
    hf.trainer_config_process(args)
    steps = int(num_training_steps or (raw.get("max_steps") if (raw.get("max_steps") or 0) > 0 else 1000))
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=int(hidden_size or 4096)))
    try:
        hf.trainer_config_finalize(args, model, steps)
    except ValueError as exc:  # HF's own mismatch list: "- ds KEY=V vs hf ARG=V"
        lines = [ln.strip()[2:] for ln in str(exc).splitlines() if ln.strip().startswith("- ds ")]
        raise InputError(
            [Problem(f"disagrees with the run: {ln}", file=file, key=ln.split("=", 1)[0].split()[-1]) for ln in lines]
            or [Problem(str(exc), file=file)]
        ) from None
    filled = hf.config
    left = _autos(filled)
    if left:
        raise InputError(
            [Problem('"auto" that HF Trainer does not fill; give a value', file=file, key=k) for k in left]
        )

    class _OneGroup:  # DeepSpeedConfig reads the world size from deepspeed.comm; no process group here
        @staticmethod
        def get_rank() -> int:
            return 0

        @staticmethod
        def get_world_size(*_a: Any) -> int:
            return ws

    try:
        with mock.patch.object(ds_config_mod, "dist", _OneGroup):
            ds_config_mod.DeepSpeedConfig(copy.deepcopy(filled))
    except Exception as exc:  # noqa: BLE001 - pydantic ValidationError, DeepSpeedConfigError, AssertionError
        raise InputError(_ds_problems(exc, file)) from None
    return filled


def _autos(d: Any, prefix: str = "") -> list[str]:
    out: list[str] = []
    if isinstance(d, Mapping):
        for k, v in d.items():
            out += _autos(v, f"{prefix}{k}.")
    elif d == "auto":
        out.append(prefix[:-1])
    return out


def _ds_problems(exc: Exception, file: str) -> list[Problem]:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            items = errors()
        except Exception:  # noqa: BLE001 - pydantic's errors() on an odd error: fall back to str(exc)
            items = []
        probs = []
        for e in items:
            loc = ".".join(str(x) for x in e.get("loc", ()))
            model = getattr(exc, "title", "") or ""
            section = {
                "DeepSpeedZeroConfig": "zero_optimization",
                "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer",
                "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param",
            }.get(model, model)
            key = f"{section}.{loc}" if section and loc else (section or loc or None)
            probs.append(Problem(f"DeepSpeed refuses it: {e.get('msg')}", file=file, key=key))
        if probs:
            return probs
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return [Problem(f"DeepSpeed refuses it: {msg}", file=file)]


def hidden_size_of(model_path: str | None) -> int | None:
    """hidden_size from a local model folder's config.json (None when unknown)."""
    if not model_path:
        return None
    p = Path(model_path) / "config.json"
    try:
        conf = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    for c in (conf, conf.get("text_config") or {}):
        if isinstance(c.get("hidden_size"), int):
            return c["hidden_size"]
        if c.get("hidden_sizes"):
            return max(c["hidden_sizes"])
    return None


def source(raw: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """(the DeepSpeed config before "auto" filling, its name for messages) or (None, None)."""
    if raw.get("deepspeed"):
        return read_file(raw["deepspeed"]), str(raw["deepspeed"])
    if raw.get("zero_stage"):
        return generate(raw), f"<generated ZeRO-{raw['zero_stage']} config>"
    return None, None


def validate_in_subprocess(raw: Mapping[str, Any], timeout_s: float = 180.0) -> list[Problem]:
    """The full parse (HF fill + DeepSpeedConfig) in a child process: config validation stays torch-free."""
    import subprocess

    payload = json.dumps({k: v for k, v in raw.items() if not k.startswith("_")}, default=str)
    try:
        res = subprocess.run(
            [sys.executable, "-m", "cockpit.strategy.deepspeed"],
            input=payload,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={
                **os.environ,
                "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu"),
                "TRANSFORMERS_VERBOSITY": "error",
            },
        )
    except subprocess.TimeoutExpired:
        return [
            Problem(
                f"checking it with DeepSpeed took over {timeout_s:.0f} s",
                file=str(raw.get("deepspeed") or "<generated>"),
                key="deepspeed",
            )
        ]
    try:
        out = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return [
            Problem(
                f"checking it with DeepSpeed failed: {tail}",
                file=str(raw.get("deepspeed") or "<generated>"),
                key="deepspeed",
            )
        ]
    return [Problem(p["message"], file=p.get("file"), key=p.get("key")) for p in out.get("problems", [])]


def _main() -> int:
    """stdin: the resolved run config as JSON; stdout: {"problems": [...], "config": {...}}."""
    import contextlib
    import io

    raw = json.loads(sys.stdin.read())
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            ds, name = source(raw)
            filled = None
            if ds is not None:
                filled = effective(
                    ds, raw, file=name or "<deepspeed>", hidden_size=hidden_size_of(raw.get("model_name_or_path"))
                )
        print(json.dumps({"problems": [], "config": filled}))
    except InputError as err:
        print(json.dumps({"problems": [{"message": p.message, "file": p.file, "key": p.key} for p in err.problems]}))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
