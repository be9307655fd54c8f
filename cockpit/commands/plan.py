"""``cockpit plan CONFIG [--set key=value ...] [--gpus N] [--gpu-memory GB] [--json]``.

Estimates the per-device peak memory of a run before launch, term by term, and, given the
device memory, says whether it fits and the cheapest change that makes it fit.
A CPU run (``use_cpu: true``, or unset on a host without GPUs: ``cockpit.device.trains_on_cpu``) is compared with the host's RAM without --gpu-memory.
A GPU run without --gpu-memory is planned on the device its YAML's header names (an MI300X preset: 192 GiB).
One verdict counts every line that has one: the device's and the host-RAM line's (judged against --host-memory,
else this machine's RAM where the run would train here). Exit 0 when it fits (or there is no verdict), 1 when
it is tight or does not fit, 2 on bad input (the message names the key).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

BAR = 30
NO_DEVICE_VERDICT = "no verdict: pass --gpu-memory GB"


def read_config(path: str) -> dict[str, Any]:
    """The YAML run config as a flat dict. (The config loader will replace this.)"""
    import yaml

    from cockpit.errors import InputError, Problem

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise InputError(Problem(f"cannot read: {e.strerror or e}", file=path)) from e
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", None)
        raise InputError(
            Problem(f"not valid YAML: {getattr(e, 'problem', e)}", file=path, line=None if line is None else line + 1)
        ) from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(Problem("must be a mapping of keys to values", file=path))
    return data


def parse_sets(items: list[str]) -> dict[str, Any]:
    import yaml

    from cockpit.errors import InputError, Problem

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(Problem(f"--set wants key=value, not {item!r}", key=key or None))
        try:
            out[key] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError:
            out[key] = value
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from cockpit.commands.common import CONFIG_FLAGS_EPILOG

    parser.add_argument(
        "config",
        nargs="?",
        default=None,
        help="run config (YAML, LLaMA-Factory key names); optional with --key value flags",
    )
    parser.epilog = CONFIG_FLAGS_EPILOG
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (repeatable), e.g. --set cutoff_len=4096",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="data-parallel size on one node (overrides nproc_per_node / nnodes)",
    )
    parser.add_argument(
        "--gpu-memory",
        type=float,
        default=None,
        metavar="GB",
        help="memory of one device in GiB (MI250 GCD: 64, MI300X: 192); enables the verdict",
    )
    parser.add_argument(
        "--host-memory",
        type=float,
        default=None,
        metavar="GB",
        help="host RAM of one node in GiB for the load-time line (default: this machine's)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as a JSON object")


def _fmt(b: float) -> str:
    gib = b / 2**30
    return f"{gib:8.2f} GiB" if gib >= 0.1 else f"{b / 2**20:8.1f} MiB"


def _gib(value: float) -> str:
    """A capacity in GiB, to a tenth: 23.5 (not 23.5401), 192 (not 192.0)."""
    return f"{value:.1f}".removesuffix(".0")


def figure_notes(d: dict[str, Any]) -> list[str]:
    """Which figure the planned peak is, and which a run measures (on the CPU they differ most)."""
    tokens = d["params"].get("tokens_per_micro_batch")
    out = [
        f"(planned peak: every micro-batch full, {tokens} tokens with samples at cutoff_len; shorter samples use less)"
    ]
    if str(d.get("device") or "").startswith("cpu"):
        out.append(
            "(a CPU run measures its RSS (Live, rank_memory VmHWM): the tensors planned here, the process (~0.8 GiB) "
            "and freed memory the C heap keeps; measured at full micro-batches: 1.8-1.9x the planned tensors, docs/planner.md)"
        )
    return out


def render(d: dict[str, Any]) -> str:
    lines = [
        f"model {d['model']} ({d['model_source']}), {d['params']['total'] / 1e9:.3f}B params "
        f"({d['params']['source']}), trainable {d['params']['trainable'] / 1e6:.2f}M, "
        f"{d['finetuning_type']}, {d['precision']}, data-parallel {d['data_parallel']}",
        *experts_lines(d["params"].get("experts")),
        f"peak at: {d['moment']}",
        "",
    ]
    peak = d["peak_bytes"] or 1
    width = max(len(t["name"]) for t in d["terms"])
    for t in d["terms"]:
        n = int(round(BAR * t["bytes"] / peak))
        bar = "#" * n + "." * (BAR - n)
        host = f"  (+{_fmt(t['host_bytes']).strip()} on CPU)" if t.get("host_bytes") else ""
        lines.append(f"  {t['name']:<{width}} {_fmt(t['bytes'])} {bar}  {t['formula']}{host}")
    lines.append(f"  {'peak per device':<{width}} {_fmt(d['peak_bytes'])}")
    lines.append(
        f"  {'allocated':<{width}} {_fmt(d['tensor_peak_bytes'])}  the tensors alone: what max_memory_allocated "
        "and torchtune's tables report (the peak adds the runtime's context and fragmentation)"
    )
    lines += [f"  {line}" for line in figure_notes(d)]
    if d.get("host_bytes_per_rank"):
        lines.append(f"  {'CPU memory per rank':<{width}} {_fmt(d['host_bytes_per_rank'])}")
    for note in d.get("notes") or []:
        lines.append(f"  note: {note}")
    h = d.get("host")
    if h:
        hv = h.get("verdict")
        tail = (
            f" -> {hv['status'].upper()} on {_gib(h['capacity_gib'])} GiB of host RAM (headroom {hv['headroom']:.0%})"
            if hv
            else ""
        )
        if not hv and h.get("no_verdict"):
            tail = f" (no verdict: {h['no_verdict']})"
        lines.append(f"  host RAM at load, per node: {h['peak_gib']:.2f} GiB ({h['pattern']}){tail}")
    if d.get("device"):
        lines.append(f"  device: {d['device']}")
    v = d.get("verdict")
    lines.append("")
    lines += verdict_lines(d)
    if v:
        s = d.get("suggestion")
        if s:
            if s.get("changes"):
                ch = ", ".join(f"{k}: {json.dumps(val)}" for k, val in s["changes"].items())
                lines.append(f"suggestion: {s['why']}")
                lines.append(
                    f"  set {ch} -> {_fmt(s['peak_bytes']).strip()} ({s['status']}, headroom {s['headroom']:.0%})"
                )
            else:
                lines.append(f"suggestion: {s['why']}")
    return "\n".join(lines)


def experts_lines(e: dict[str, Any] | None) -> list[str]:
    """A mixture-of-experts model's lines: total and active parameters, what its experts and routers take."""
    if not e:
        return []
    shared = f" + {e['shared']} shared" if e.get("shared") else ""
    kept = "every layer's kept for the aux loss (moe_aux_loss_coef)" if e["router_logits_kept"] else "fp32 softmax"
    lines = [
        f"mixture of experts: {e['routed']} routed experts, top-{e['top_k']}{shared}; "
        f"{e['total_params'] / 1e9:.2f}B total params, {e['active_params'] / 1e9:.2f}B active a token "
        f"(MFU counts these)",
        f"  expert weights {_fmt(e['expert_weights_bytes']).strip()} per device; per micro-batch: router logits "
        f"{_fmt(e['router_logits_bytes']).strip()} ({kept}), routed-expert activations "
        f"{_fmt(e['routed_activations_bytes']).strip()}",
    ]
    if e.get("merged_lora_experts_bytes"):
        lines.append(
            f"  LoRA on the fused experts: each MoE layer's merged weights (W + BA) saved until its backward, "
            f"{_fmt(e['merged_lora_experts_bytes']).strip()} (gradient checkpointing keeps one layer's)"
        )
    return lines


def verdict_lines(d: dict[str, Any]) -> list[str]:
    """The plan's one verdict (``overall``: the worst of the device's and the host line's), then the
    device's when the host line decided it, or why there is no device verdict."""
    v, overall, h = d.get("verdict"), d.get("overall"), d.get("host") or {}
    device = ""
    if v:
        source = f" of {d['capacity_source']}" if d.get("capacity_source") else ""
        device = (
            f"planned peak {_fmt(d['peak_bytes']).strip()} -> {v['status'].upper()} on "
            f"{_gib(d['capacity_gib'])} GiB{source} (headroom {v['headroom']:.0%})"
        )
    out: list[str] = []
    if overall and "device" not in overall["by"]:  # the host line decides: said first
        hv = h["verdict"]
        out.append(
            f"verdict: {overall['status'].upper()}: host RAM at load, per node, {h['peak_gib']:.2f} GiB on "
            f"{_gib(h['capacity_gib'])} GiB (headroom {hv['headroom']:.0%}); the device: "
            + (device or NO_DEVICE_VERDICT)
        )
    elif device:
        out.append(f"verdict: {device}")
    else:
        out.append(
            NO_DEVICE_VERDICT + " (64 for an MI250 GCD, 192 for an MI300X), or name the device in the YAML's "
            "first comment line (# MI300X ...)"
        )
    return out


def run(args: argparse.Namespace) -> int:
    from cockpit.errors import InputError, Problem

    try:
        from cockpit.config.flags import typed_values
        from cockpit.config.schema import ALIASES

        flags = getattr(args, "config_flags", None) or []
        if args.config is None and not flags:
            raise InputError(Problem("give a YAML config, or the config as flags (--model_name_or_path M ...)"))
        cfg = read_config(args.config) if args.config else {}
        cfg = {ALIASES.get(k, k): v for k, v in cfg.items()}
        cfg.update(typed_values(flags))
        cfg.update(parse_sets(args.set))
        if args.gpus is not None and args.gpus < 1:
            raise InputError(Problem("must be at least 1", key="--gpus"))
        if args.gpu_memory is not None and args.gpu_memory <= 0:
            raise InputError(Problem("must be a positive number of GiB", key="--gpu-memory"))
        if args.host_memory is not None and args.host_memory <= 0:
            raise InputError(Problem("must be a positive number of GiB", key="--host-memory"))
        from cockpit.plan import plan

        result = plan(
            cfg,
            gpus=args.gpus,
            gpu_memory_gb=args.gpu_memory,
            host_memory_gb=args.host_memory,
            base_dir=os.path.dirname(os.path.abspath(args.config)) if args.config else os.getcwd(),
            config_path=args.config,
        )
    except InputError as e:
        print(f"cockpit plan: {e}", file=sys.stderr)
        return 2
    d = result.as_dict()
    if args.json:
        print(json.dumps(d, indent=2, default=str))
    else:
        print(render(d))
    overall = d.get("overall")
    return 0 if not overall or overall["status"] == "fits" else 1
