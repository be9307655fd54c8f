"""Find the micro-batch that fits and runs fastest, by short real training steps (``cockpit tune``).

The global batch G = per_device_train_batch_size x gradient_accumulation_steps (x ranks) stays
fixed: every candidate micro-batch m divides the per-device share G/ranks and runs with
accumulation (G/ranks)/m. All candidates run in this one process, smallest first: the model and
tokenizer are built once, each candidate gets its own HF Trainer (fresh optimizer) and runs a few
real optimizer steps on the config's longest samples (the worst case for memory). The first step
is a warm-up (it creates the optimizer states) and is left out of the timing; the peak covers
every step.

Memory: on CUDA/ROCm ``torch.cuda.max_memory_allocated`` (reset per candidate); the cap is the
device memory, or ``--memory-cap`` enforced by ``torch.cuda.set_per_process_memory_fraction`` so
the allocator itself refuses. On the CPU the cap is enforced by the live-tensor-bytes tracker of
:mod:`cockpit.plan.measure`, which raises ``torch.OutOfMemoryError`` from inside the op: one
``except`` path for both. After an out-of-memory the candidate's tensors are dropped (del, gc,
empty_cache) and the search stops upward (a larger micro-batch needs more).

A candidate *fits* when its measured peak leaves the planner's headroom (``TIGHT_HEADROOM``,
10 % of the cap) for what a short trial cannot see: longer batches later in the data, allocator
fragmentation, the runtime context. Among those that fit, the best tokens/s wins.

Multi-rank runs: plain data parallel (DDP) is tried on one rank with the per-device share (each
rank holds a full replica, so one rank's memory is the per-device memory, less DDP's gradient
buckets). DeepSpeed and FSDP shard states over ranks, which one process cannot reproduce: refused.

torch / transformers are imported inside the trial functions only (``run_trials`` and below).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from cockpit.errors import InputError, Problem
from cockpit.plan.estimate import GiB
from cockpit.plan.verdict import TIGHT_HEADROOM

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig

BATCH_KEYS = ("per_device_train_batch_size", "gradient_accumulation_steps")
SHARDING_KEYS = ("deepspeed", "zero_stage", "fsdp")
# keys whose relative values are resolved against the config's folder (cockpit.config.load)
_PATH_KEYS = ("model_name_or_path", "dataset_dir", "deepspeed", "probes", "adapter_name_or_path")


def refuse_sharded(raw: Mapping[str, Any]) -> None:
    """DeepSpeed / FSDP: one trial process cannot show a sharded rank's memory."""
    for key in SHARDING_KEYS:
        if raw.get(key) not in (None, "", False, 0):
            raise InputError(
                Problem(
                    "cockpit tune trials one rank, and a sharded run's per-device memory (DeepSpeed ZeRO, FSDP) "
                    "depends on the other ranks; unset it to tune the plain data-parallel batch, or use "
                    "cockpit plan for the sharded run",
                    key=key,
                )
            )


def candidates_for(local_batch: int, given: list[int] | None, current: int) -> list[int]:
    """Candidate micro-batches, ascending. Default: powers of two dividing ``local_batch``, plus the
    config's own micro-batch. Given ones must each divide ``local_batch``."""
    if given is None:
        out = {current}
        m = 1
        while m <= local_batch:
            if local_batch % m == 0:
                out.add(m)
            m *= 2
        return sorted(out)
    bad = [m for m in given if m < 1 or local_batch % m]
    if bad:
        raise InputError(
            Problem(
                f"{', '.join(map(str, bad))} must divide the per-device batch {local_batch} "
                "(per_device_train_batch_size x gradient_accumulation_steps), which stays fixed; "
                f"divisors: {', '.join(str(d) for d in range(1, local_batch + 1) if local_batch % d == 0)}",
                key="--candidates",
            )
        )
    return sorted(set(given))


def parse_candidates(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise InputError(
            Problem(f"a comma list of micro-batch sizes like 1,2,4,8, not {text!r}", key="--candidates")
        ) from None
    if not vals:
        raise InputError(Problem("give at least one micro-batch size", key="--candidates"))
    return vals


def status_of(peak: float | None, cap: float, oom: bool) -> str:
    if oom:
        return "oom"
    if peak is None:
        return "skipped"
    return "fits" if peak <= (1 - TIGHT_HEADROOM) * cap else "tight"


def choose(trials: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(fastest that fits, largest that fits); None when nothing fits."""
    fit = [t for t in trials if t["status"] == "fits"]
    if not fit:
        return None, None
    fastest = max(fit, key=lambda t: (t["tokens_per_s"] or 0.0, t["micro_batch"]))
    return fastest, max(fit, key=lambda t: t["micro_batch"])


def planned(cfg: RunConfig, m: int, a: int) -> tuple[float | None, float | None]:
    """The planner's (tensor peak, device peak) in GiB for micro-batch m; None where it cannot tell."""
    from cockpit.plan import estimate_config

    try:
        est = estimate_config(
            {**cfg.mapping(), "per_device_train_batch_size": m, "gradient_accumulation_steps": a}, base_dir=cfg.base_dir
        )[1]
    except InputError:
        return None, None
    return est.tensor_peak / GiB, est.peak / GiB


# -- the trials (torch) -------------------------------------------------------------------------
def trial_rows(rendered: list[Any], n: int) -> list[dict[str, list[int]]]:
    """The ``n`` longest trainable samples (cycled when there are fewer): the worst case for memory."""
    rows = sorted((r for r in rendered if r.target_kept > 0), key=lambda r: -len(r.input_ids))
    if not rows:
        raise InputError(Problem("every sample loses all its assistant tokens; nothing to train on", key="cutoff_len"))
    return [{"input_ids": rows[i % len(rows)].input_ids, "labels": rows[i % len(rows)].labels} for i in range(n)]


def run_trials(
    cfg: RunConfig,
    cands: list[int],
    local_batch: int,
    cap_gb: float | None,
    steps: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Run every candidate (ascending) in this process; returns {device, cap_gb, trials}."""
    import tempfile

    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import config_model, load_tokenizer
    from cockpit.train.model import build_model

    device = TrialDevice.open(cfg, cap_gb)
    ref = config_model(cfg, log=log)
    tok = load_tokenizer(cfg, ref, log=log)
    prepared = prepare_dataset(cfg, tok)
    if prepared.image_plan:  # its trial rows carry no images: the vision tower would go unmeasured
        raise InputError(Problem("cockpit tune on a dataset with images: not built yet (issue 63)", key="dataset"))
    rows = trial_rows(prepared.rendered, steps * local_batch)
    model = build_model(cfg, ref, device.use_cpu, 0)
    plan_cfg = cfg.replace(model_name_or_path=ref.path) if not ref.hub else cfg
    trials: list[dict[str, Any]] = []
    stop_at: int | None = None
    with tempfile.TemporaryDirectory(prefix="cockpit-tune-") as tmp:
        for m in cands:
            t = new_trial(plan_cfg, m, local_batch // m)
            trials.append(t)
            if stop_at is not None:
                t["error"] = f"not tried: micro-batch {stop_at} already ran out of memory"
                continue
            log(f"trial: micro-batch {m} x accumulation {t['accumulation']}, {steps} steps")
            tcfg = cfg.replace(
                per_device_train_batch_size=m,
                gradient_accumulation_steps=t["accumulation"],
                max_steps=steps,
                save_strategy="no",
                val_size=0,
                logging_steps=10**6,
                report_to="none",
                dataloader_num_workers=0,
            )
            run_trial(t, device, tcfg, model, tok, rows, Path(tmp))
            stop_at = m if t["oom"] else None
            log(
                f"  -> {t['status']}"
                + (f", peak {t['peak_gb']:.4f} GiB, {t['tokens_per_s']} tokens/s" if t["peak_gb"] else "")
            )
    return {"device": device.name, "cap_gb": round(device.cap / GiB, 6), "trials": trials}


def new_trial(plan_cfg: RunConfig, m: int, a: int) -> dict[str, Any]:
    """A trial's record before it runs, with the planner's figures for the same batch."""
    plan_t, plan_d = planned(plan_cfg, m, a)
    return {
        "micro_batch": m,
        "accumulation": a,
        "peak_gb": None,
        "planned_gb": None if plan_t is None else round(plan_t, 6),
        "planned_device_gb": None if plan_d is None else round(plan_d, 6),
        "tokens_per_s": None,
        "oom": False,
        "status": "skipped",
        "error": None,
        "pid": os.getpid(),
    }


class TrialDevice:
    """Where the trials run and the memory cap they are held to (see the module's docstring)."""

    def __init__(self, use_cpu: bool, name: str, cap: float) -> None:
        self.use_cpu, self.name, self.cap = use_cpu, name, cap

    @classmethod
    def open(cls, cfg: RunConfig, cap_gb: float | None) -> TrialDevice:
        import torch

        from cockpit.train.arguments import trains_on_cpu

        if trains_on_cpu(cfg):
            import psutil

            return cls(True, "cpu", cap_gb * GiB if cap_gb else float(psutil.virtual_memory().available))
        torch.cuda.set_device(0)
        props = torch.cuda.get_device_properties(0)
        total = float(props.total_memory)
        cap = min(cap_gb * GiB, total) if cap_gb else total
        if cap < total:  # the allocator itself refuses beyond the cap: a real OutOfMemoryError
            torch.cuda.set_per_process_memory_fraction(cap / total, 0)
        return cls(False, f"cuda:0 {props.name}", cap)

    def measure(self, model: Any, trainer: Any) -> tuple[float, float | None]:
        """Train and return (peak bytes, reserved bytes or None): the allocator's peak on a GPU,
        the live-tensor tracker's (with the cap) on the CPU."""
        import gc

        import torch

        from cockpit.plan.measure import live_tensor_bytes

        if self.use_cpu:
            gc.collect()
            meter = live_tensor_bytes(cap=int(self.cap))
            with meter:
                meter.track_existing(list(model.parameters()) + list(model.buffers()))
                meter.reset_peak()
                trainer.train()
            return float(meter.peak), None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        trainer.train()
        return float(torch.cuda.max_memory_allocated()), float(torch.cuda.max_memory_reserved())


def run_trial(
    t: dict[str, Any],
    device: TrialDevice,
    tcfg: RunConfig,
    model: Any,
    tok: Any,
    rows: list[dict[str, list[int]]],
    tmp: Path,
) -> None:
    """One candidate: the SFT trainer (every candidate sees the same rows in the same steps), its
    peak and tokens/s after the warm-up step, or its out-of-memory; ``t`` is filled in."""
    import contextlib
    import gc
    import io

    import torch

    from cockpit.train.arguments import training_arguments
    from cockpit.train.recipes.sft import sft_trainer

    args = training_arguments(tcfg, {"checkpoints": tmp}, device.use_cpu, 1)
    clock = step_clock(device.use_cpu)
    trainer = sft_trainer(in_order_trainer(), tcfg, model, args, tok, rows, callbacks=[clock])
    peak: float | None = None
    try:
        with contextlib.redirect_stdout(
            io.StringIO()
        ):  # the Trainer prints its metrics dicts: keep stdout for our table / JSON
            peak, reserved = device.measure(model, trainer)
        if reserved is not None:
            t["reserved_gb"] = round(reserved / GiB, 6)  # allocator's view (scripts/gpu_check.sh)
    except torch.OutOfMemoryError as exc:
        t["oom"], t["error"] = True, str(exc).strip().splitlines()[0][:300]
    finally:
        del trainer
        model.zero_grad(set_to_none=True)
        gc.collect()
        if not device.use_cpu:
            torch.cuda.empty_cache()
    if peak is not None:
        t["peak_gb"] = round(peak / GiB, 6)
        (t0, n0), (t1, n1) = clock.marks[0], clock.marks[-1]
        t["tokens_per_s"] = round((n1 - n0) / (t1 - t0), 2) if t1 > t0 else None
    t["status"] = status_of(peak, device.cap, t["oom"])


def in_order_trainer() -> type:
    """CockpitTrainer reading the rows in order: every candidate sees the same batches."""
    import torch

    from cockpit.train.trainer import CockpitTrainer

    class InOrder(CockpitTrainer):
        def _get_train_sampler(self, *a: Any, **k: Any) -> Any:
            return torch.utils.data.SequentialSampler(self.train_dataset)

    return InOrder


def step_clock(use_cpu: bool) -> Any:
    """A callback recording (time, tokens seen) at every optimizer step's end."""
    import torch
    from transformers import TrainerCallback

    class Clock(TrainerCallback):  # type: ignore[misc]  # TrainerCallback is Any here (follow_imports = skip)
        def __init__(self) -> None:
            self.marks: list[tuple[float, int]] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not use_cpu:
                torch.cuda.synchronize()
            self.marks.append((time.perf_counter(), int(state.num_input_tokens_seen)))

    return Clock()


# -- the tuned config ---------------------------------------------------------------------------
def _scalar(v: Any) -> str:
    return yaml.safe_dump([v], default_flow_style=True, allow_unicode=True).strip()[1:-1]


def rewrite_yaml(text: str, changes: Mapping[str, Any], header: str = "") -> str:
    """``text`` with the top-level ``changes`` applied in place (comments and order kept); keys it
    lacks are appended. Falls back to a plain dump when a changed value spans lines or is nested."""
    node = yaml.compose(text, Loader=yaml.SafeLoader) if text.strip() else None
    spans: list[tuple[int, int, str]] = []
    missing = dict(changes)
    plain = isinstance(node, yaml.MappingNode) or node is None
    for key_node, val_node in node.value if isinstance(node, yaml.MappingNode) else []:
        k = str(key_node.value)
        if k not in changes:
            continue
        missing.pop(k)
        if (
            not isinstance(val_node, yaml.ScalarNode)
            or val_node.start_mark.line != val_node.end_mark.line
            or isinstance(changes[k], (dict, list))
        ):
            plain = False
        spans.append((val_node.start_mark.index, val_node.end_mark.index, _scalar(changes[k])))
    head = "".join(f"# {line}\n" for line in header.splitlines())
    if not plain:
        data = {**(yaml.safe_load(text) or {}), **changes}
        return head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    for start, end, new in sorted(spans, reverse=True):
        text = text[:start] + new + text[end:]
    if missing:
        if text and not text.endswith("\n"):
            text += "\n"
        text += "".join(f"{k}: {_scalar(v)}\n" for k, v in missing.items())
    return head + text


def relocated_paths(raw: Mapping[str, Any], src_dir: Path, out_dir: Path) -> dict[str, str]:
    """Relative path values found only beside the source config, as absolute paths (for an --out
    in another folder; the loader resolves against the working dir, then the config's folder)."""
    if src_dir.resolve() == out_dir.resolve():
        return {}

    def moved(v: str) -> str:
        v = v.strip()
        if not v or v.startswith("@") or os.path.isabs(os.path.expanduser(v)) or (Path.cwd() / v).exists():
            return v
        return str((src_dir / v).resolve()) if (src_dir / v).exists() else v

    out = {}
    for key in (*_PATH_KEYS, "dataset"):  # dataset: a comma list of names or files
        v = raw.get(key)
        if isinstance(v, str):
            items = v.split(",") if key == "dataset" else [v]
            new = [moved(x) for x in items]
            if new != [x.strip() for x in items]:
                out[key] = ",".join(new)
    return out


def default_out(config: str | os.PathLike[str]) -> Path:
    p = Path(config)
    return p.with_name(f"{p.stem}.tuned.yaml")


# -- the whole search ---------------------------------------------------------------------------
def tune(
    config: str,
    overrides: list[str] | None = None,
    *,
    memory_cap_gb: float | None = None,
    gpus: int | None = None,
    candidates: list[int] | None = None,
    steps: int = 3,
    out: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Trial every candidate, choose, write the tuned config. Returns the JSON document of
    ``cockpit tune --json``; ``ok`` is False when nothing fits (no config written then).
    Raises InputError (naming the key or option) on bad input."""
    from cockpit.config import load_config, parse_overrides, read_yaml

    check_options(memory_cap_gb, steps, gpus)
    raw, _ = read_yaml(config)
    ov = parse_overrides(overrides or [])
    if gpus is not None:
        ov.update(nproc_per_node=gpus, nnodes=1)
    refuse_sharded({**raw, **ov})
    refuse_stage({**raw, **ov})
    out_path = tuned_path(config, out)
    cfg = load_config(config, ov)
    world = cfg.world_size
    m0, a0 = int(cfg.per_device_train_batch_size), int(cfg.gradient_accumulation_steps)
    local = m0 * a0
    cands = candidates_for(local, candidates, m0)
    res = run_trials(cfg, cands, local, memory_cap_gb, steps, log)
    trials, cap_gb = res["trials"], res["cap_gb"]
    chosen, largest = choose(trials)
    doc: dict[str, Any] = {
        "ok": chosen is not None,
        "out": None,
        "chosen": None,
        "largest_fitting": None,
        "trials": trials,
        "cap_gb": cap_gb,
        "headroom": TIGHT_HEADROOM,
        "device": res["device"],
        "config": str(config),
        "global_batch": local * world,
        "per_device_batch": local,
        "world": world,
        "steps": steps,
        "was": {"per_device_train_batch_size": m0, "gradient_accumulation_steps": a0},
        "message": "",
    }
    if chosen is None or largest is None:  # both None: nothing fits
        doc["message"] = nothing_fits(trials[0], cap_gb, cfg)
        return doc
    doc["chosen"], doc["largest_fitting"] = trial_setting(chosen), trial_setting(largest)
    m, a = chosen["micro_batch"], chosen["accumulation"]
    msg = chosen_message(chosen, largest, local * world, cap_gb, (m0, a0))
    changes = {
        **{k: getattr(cfg, k) for k in ov},
        **relocated_paths(raw, Path(config).parent, out_path.parent),
        "per_device_train_batch_size": m,
        "gradient_accumulation_steps": a,
    }
    write_tuned(config, out_path, changes, tuned_header(config, res["device"], chosen, (m0, a0), cap_gb))
    load_config(out_path)  # what cockpit train / check will read: it must load
    doc["out"] = str(out_path)
    doc["message"] = msg
    return doc


def check_options(memory_cap_gb: float | None, steps: int, gpus: int | None) -> None:
    """Refuse a non-positive --memory-cap, fewer than 2 --steps, or fewer than 1 --gpus."""
    if memory_cap_gb is not None and not memory_cap_gb > 0:
        raise InputError(Problem(f"must be a positive number of GiB, not {memory_cap_gb:g}", key="--memory-cap"))
    if steps < 2:
        raise InputError(
            Problem(f"at least 2 (the first step is a warm-up, left out of the timing), not {steps}", key="--steps")
        )
    if gpus is not None and gpus < 1:
        raise InputError(Problem(f"must be at least 1, not {gpus}", key="--gpus"))


def refuse_stage(merged: Mapping[str, Any]) -> None:
    """Refuse a stage other than sft (the config with the overrides applied)."""
    if (merged.get("stage") or "sft") != "sft":  # trials build the SFT trainer; recipes: cockpit/train/recipes/
        raise InputError(
            Problem("cockpit tune measures stage sft trials so far; use cockpit plan for this stage", key="stage")
        )


def tuned_path(config: str, out: str | None) -> Path:
    """Where the tuned config goes (--out or beside the input); never the input itself, never a folder."""
    out_path = Path(out) if out else default_out(config)
    if out_path.resolve() == Path(config).resolve():
        raise InputError(Problem("is the input config; cockpit tune never overwrites it", key="--out"))
    if out_path.is_dir():
        raise InputError(Problem(f"{out_path} is a folder; give a file name", key="--out"))
    return out_path


def trial_setting(t: dict[str, Any]) -> dict[str, Any]:
    """A trial's batch settings and measurements, as reported under ``chosen`` / ``largest_fitting``."""
    return {
        "per_device_train_batch_size": t["micro_batch"],
        "gradient_accumulation_steps": t["accumulation"],
        "tokens_per_s": t["tokens_per_s"],
        "peak_gb": t["peak_gb"],
    }


def chosen_message(
    chosen: dict[str, Any], largest: dict[str, Any], global_batch: int, cap_gb: float, was: tuple[int, int]
) -> str:
    """The summary line for a successful search: the chosen setting, the largest that fits, the old setting."""
    m, a = chosen["micro_batch"], chosen["accumulation"]
    msg = (
        f"micro-batch {m} x accumulation {a} (global batch {global_batch}): the fastest that fits, "
        f"{chosen['tokens_per_s']} tokens/s, peak {chosen['peak_gb']:.4g} GiB of the {cap_gb:.4g} GiB cap "
        f"(fits: at least {TIGHT_HEADROOM:.0%} headroom)"
    )
    if largest is not chosen:
        msg += f"; the largest that fits is micro-batch {largest['micro_batch']} ({largest['tokens_per_s']} tokens/s)"
    if (m, a) == was:
        msg += "; that is the config's own setting"
    return msg


def tuned_header(config: str, device: str, chosen: dict[str, Any], was: tuple[int, int], cap_gb: float) -> str:
    """The comment heading the tuned config: its source, when, where, and the chosen setting."""
    m, a = chosen["micro_batch"], chosen["accumulation"]
    return (
        f"tuned by cockpit tune from {Path(config).name} on {time.strftime('%Y-%m-%d %H:%M')} ({device}):\n"
        f"micro-batch {m} x accumulation {a} (was {was[0]} x {was[1]}); measured peak {chosen['peak_gb']:.4g} GiB "
        f"of a {cap_gb:.4g} GiB cap, {chosen['tokens_per_s']} tokens/s"
    )


def write_tuned(config: str, out_path: Path, changes: Mapping[str, Any], header: str) -> None:
    """Write the input config with ``changes`` applied to ``out_path`` atomically (a temporary file, then a rename)."""
    text = Path(config).read_bytes().decode("utf-8-sig")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f".{out_path.name}.tmp")
    tmp.write_text(rewrite_yaml(text, changes, header), encoding="utf-8")
    os.replace(tmp, out_path)


def nothing_fits(smallest: dict[str, Any], cap_gb: float, cfg: RunConfig) -> str:
    m = smallest["micro_batch"]
    if smallest["oom"]:
        plan = f" (the planner says {smallest['planned_gb']:.4g} GiB)" if smallest["planned_gb"] else ""
        what = f"micro-batch {m} ran out of memory: over the {cap_gb:.4g} GiB cap{plan}"
    else:
        what = (
            f"micro-batch {m} peaked at {smallest['peak_gb']:.4g} GiB, less than {TIGHT_HEADROOM:.0%} "
            f"under the {cap_gb:.4g} GiB cap"
        )
    tries = (
        ([] if cfg.gradient_checkpointing else ["gradient_checkpointing: true"])
        + ([] if cfg.finetuning_type == "lora" else ["finetuning_type: lora"])
        + [f"a shorter cutoff_len (now {cfg.cutoff_len})", "a bigger --memory-cap (or device)"]
    )
    return f"nothing fits: {what}; try {', '.join(tries)}"
