"""What a run leaves and starts from: its checkpoints (the newest one with a finite loss, the
resume point and the totals saved with it, the adapter after a NaN), its loss curve (loss.png,
the summary's eval losses) and its throughput."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cockpit.store.events import read_all

if TYPE_CHECKING:
    from cockpit.config.run_config import RunConfig
    from cockpit.store.events import EventWriter
    from cockpit.train.callbacks import CockpitCallback


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


def resume_point(
    cfg: RunConfig, dirs: dict[str, Path], writer: EventWriter | None, log: Callable[[str], object]
) -> tuple[str | None, dict[str, Any]]:
    """The checkpoint this attempt starts from, and the run's totals saved with it (first loss,
    training seconds). ``resume_from_checkpoint: last`` that finds none says so (a warning event
    and a log line) before starting from scratch."""
    from cockpit.train.trainer import checkpoint_record

    resume = cfg.resume_from_checkpoint
    if resume in ("last", "true", "True", True):
        resume = last_checkpoint(dirs["checkpoints"])
        if resume is None:
            message = f"resume_from_checkpoint: last found no complete checkpoint with a finite loss in {dirs['checkpoints']}; training starts from step 0"
            log(f"warning: {message}")
            if writer is not None:
                writer.emit(
                    "alert",
                    level="warn",
                    code="no_checkpoint",
                    message=message,
                    remedies=["check output_dir", "cockpit runs shows where each run saved"],
                )
    if not resume:
        return None, {}
    record = checkpoint_record(resume)
    return str(resume), {
        k: record[k] for k in ("first_loss", "first_loss_step", "train_time_s") if record.get(k) is not None
    }


MODEL_FILES_SKIPPED = (
    "optimizer",
    "scheduler",
    "rng_state",
    "trainer_state",
    "training_args",
    "cockpit_checkpoint",
    "global_step",
    "zero_to_fp32",
    "latest",
)


def mark_poisoned(checkpoints: Path, from_step: int) -> list[str]:
    """Rank 0, after weights found poisoned by the update of ``from_step`` (a sampling stage's
    non-finite sampling): the checkpoints saved from that step on hold those weights, so their
    records say the loss was not finite, and neither the adapter nor ``resume_from_checkpoint:
    last`` ever starts from them. Returns their names."""
    from cockpit.store.rundir import atomic_write_json
    from cockpit.train.trainer import RECORD, checkpoint_record

    marked = []
    for d in sorted(checkpoints.glob("checkpoint-*")) if checkpoints.is_dir() else ():
        step = d.name.split("-")[-1]
        if step.isdigit() and int(step) >= from_step and (d / "trainer_state.json").exists():
            atomic_write_json(d / RECORD, {**checkpoint_record(d), "loss_finite": False})
            marked.append(d.name)
    return marked


def adapter_from_last_good(dirs: dict[str, Path], rank: int, log: Callable[[str], object]) -> str | None:
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
    from cockpit.store.events import as_float

    pts = [(e["step"], as_float(e.get(field))) for e in events if e["kind"] == kind]
    return [(s, v) for s, v in pts if v is not None and math.isfinite(v)]


def eval_losses(events: list[dict[str, Any]], field: str = "eval_loss") -> dict[str, Any] | None:
    """The run's eval losses (or another eval ``field``: ``eval_accuracy``, best = highest) for
    summary.json: how many, the first, the last and the best as [step, value]; None without them."""
    pts = loss_series(events, "eval", field)
    if not pts:
        return None
    best = (max if field == "eval_accuracy" else min)(pts, key=lambda p: p[1])
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


def throughput(callback: CockpitCallback, train_runtime: float, tokens_total: int) -> dict[str, Any]:
    """The summary's tokens/s with the warm-up steps left out (all steps when the run ended in
    its warm-up), and the all-steps figure beside it."""
    overall = round(tokens_total / train_runtime, 2) if train_runtime > 0 else None
    steady = callback.steady_tokens_per_s()
    return {
        "tokens_per_s": round(steady, 2) if steady is not None else overall,
        "tokens_per_s_with_warmup": overall,
        "warmup_steps_excluded": callback.warmup_steps if steady is not None else 0,
    }


def utilisation(
    callback: CockpitCallback, throughput: dict[str, Any], train_runtime: float, tokens_total: int, steps: int
) -> dict[str, Any]:
    """The summary's per-device tokens/s and samples/s, model TFLOPS per device, MFU (and HFU under
    gradient checkpointing) from the summary's tokens/s and the run's mean tokens per sample, and the
    peak they are measured against; {} on the ranks without the meter (rank 0 has it). samples/s is
    tokens/s over the mean tokens per sample: the warm-up left out as tokens/s leaves it out (all steps
    when tokens are not counted)."""
    meter = callback.meter
    if meter is None:
        return {}
    samples = steps * callback.global_batch
    seq_len = tokens_total / samples if samples and tokens_total else float(callback.cfg.cutoff_len or 0)
    tokens_per_s = throughput.get("tokens_per_s")
    if tokens_per_s and seq_len:
        samples_per_s = tokens_per_s / seq_len
    else:
        samples_per_s = samples / train_runtime if train_runtime > 0 else 0.0
    figures = meter.figures(throughput.get("tokens_per_s"), samples_per_s, seq_len)
    return {
        "samples_per_s": round(samples_per_s, 3),
        **figures,
        "peak_tflops": meter.peak.tflops,
        "peak_device": meter.peak.device,
        "peak_source": meter.peak.source,
        "peak_dtype": meter.peak.dtype,
        "trainable_share": round(meter.trainable_share, 6),  # what the MFU counts: frozen base or not
        "mfu_why_not": (meter.why or None) if figures.get("mfu") is None else None,
    }
