"""The run's append-only event log (``events.jsonl``): schema, writer, incremental reader.

Every line is one JSON object with at least ``v`` (schema version), ``t`` (unix time, seconds)
and ``kind``. Fields are added without a new version (readers ignore what they do not know, and
treat a missing field as absent: the per-device throughput and MFU fields came that way); a change
of a field's meaning bumps ``SCHEMA_VERSION``. Writers append whole lines with a single ``write`` on an ``O_APPEND`` descriptor,
so the supervisor and rank 0 can both append without interleaving partial lines.

This module must stay importable without torch or textual: the UI, the supervisor and the
training ranks all use it.

Kinds and their fields (units in the field names or stated here):

- ``run_started``: run_id, attempt, model, dataset, method, world_size, nproc_per_node, nnodes,
  total_steps (may be null until the ranks know it), output_dir, supervisor_pid
- ``state``: state (queued|starting|running|stopping|finished|failed|stopped|killed|cancelled|lost), reason;
  killed: ended by a kill request (``cockpit stop --kill``, the cockpit's kill key), no checkpoint at the end;
  queued and cancelled: Slurm runs (``cockpit.slurm``), the queued event also has slurm_job_id;
  by (optional): "liveness check" when a reader ended a run whose supervisor was gone
- ``rank_started``: rank, local_rank, pid, node_rank, host, visible_devices (the rank's own
  HIP/ROCR/CUDA_VISIBLE_DEVICES, those set)
- ``train_begin``: total_steps, epochs (the epochs these steps make: total_steps / steps_per_epoch, so
  ``max_steps`` below one epoch reads 0.7), steps_per_epoch (optimizer steps per pass over the data;
  null when the data has no length), num_train_epochs (the config's), start_step (past 0 on a
  resume), world_size, global_batch, flops (rank 0, ``cockpit/train/flops_meter.py``: peak_tflops (the
  device's dense peak in the run's dtype, null: "peak unknown"), peak_source (table|measured|cached|unknown),
  peak_device, dtype, model_flops_per_token and hardware_flops_per_token at at_seq_len (cutoff_len),
  matmul_params (N), trainable_share, recompute (gradient checkpointing), why (null, or why no MFU))
- ``train_end``: step (the trainer's loop is over; saving and the probes after training follow)
- ``step``: step, total_steps, epoch, loss, lr, grad_norm, tokens_per_s (trained tokens per
  second, all ranks, since the previous step event with the warm-up steps left out: null while
  ``warmup`` is true; warm-up = the first tenth of the steps, 1 to 5), warmup, samples_per_s (since the previous step
  event; the first from the first step's start, after the probes before training), tokens_seen,
  tokens_per_s_per_device and samples_per_s_per_device (the two over the world size), model_tflops_per_device
  (model FLOPs per token x tokens/s per device / 10**12), mfu (0..1: that over the peak; null in the warm-up
  or with no known peak), hfu (with gradient checkpointing: the recomputation counted;
  ``cockpit/plan/flops.py``), mem (a mapping rank -> that rank's own
  figures, gathered from every rank at each logging step: allocated_mb (``memory_allocated``),
  reserved_mb (``memory_reserved``), peak_mb (``max_memory_allocated`` since the previous logging
  step: the peak is reset after each reading), capacity_mb (the device's total memory), rss_mb
  (the process's resident set), source ("torch.cuda" on a GPU, ROCm included; on the CPU "rss":
  allocator values null, or "live_tensors" with ``cpu_memory_tracker``: allocated/peak are live
  tensor bytes counted by ``plan/measure.py``, reserved null; capacity the host's RAM),
  node_rank, local_rank, host; MiB = 2**20 bytes); a mixture-of-experts model's (``cockpit/train/moe.py``):
  aux_loss (the router's load-balancing loss, mean over the interval and the ranks; with
  ``moe_aux_loss_coef``), expert_load (the tokens each router sent to each expert over the interval, all
  ranks: experts, top_k, layers, assignments, hot / cold ([expert, load] per layer, load a multiple of the
  fair share), rows (one level character per expert and layer; ``cockpit/store/expert_load.py``))
- ``heartbeats``: steps (a list of [step, node ranges]: the nodes whose report in the rendezvous
  store is new since the previous heartbeats event, grouped by the last training step each one's
  local rank 0 finished, null before the first; ranges like "0-62,64"), hosts (optional: node ->
  host, for nodes first seen), ended (optional: ranges of the nodes whose training just ended);
  written by global rank 0 when a node's step moved, else every few seconds
  (``cockpit/telemetry/node.py``, ``cockpit/store/node_grid.py``). Logs before it have one
  ``heartbeat`` per node (node_rank, host, step, seq, train_ended); readers take both
- ``node_telemetry``: the other nodes' GPUs, relayed by global rank 0 (``cockpit/store/node_grid.py``):
  nodes (optional: one row per node, {node, host, backend, total_mb, mem (VRAM used, integer percent
  of total_mb), util (percent), temp (degrees C), power (W)}, lists in GPU index order, null where not
  measured; totals_mb when the node's GPUs differ; unavailable when it has none), period_s (when the
  next whole grid is due), outliers (the hottest, least busy and fullest GPUs as {node_rank, why,
  index, vram_used_mb, vram_total_mb, util_pct, temp_c, power_w}); the whole grid within a byte
  budget, the outliers alone in between
- ``eval``: step, eval_loss, eval_accuracy (``compute_accuracy``: the share of labelled tokens predicted)
- ``checkpoint_saved``: step, path, loss_finite (the training loss up to it was finite on every rank)
- ``alert``: level (info|warn|error), code (nan_loss|loss_spike|loss_scale_overflow (info: the fp16 loss scaler skipped an update; 20 logging steps in a row skipped are a nan_loss)|hang|oom|rank_died|fp16_on_cpu|
  memory_pressure|no_checkpoint|reward_hacking|expert_idle|expert_overloaded|slow_step|early_grad_norm|...), message, remedies (list of strings), rank (optional).
  slow_step (docs/rocm.md item 6; rank 0, on a GPU with a table peak): mfu, threshold, source. early_grad_norm
  (item 7): source. Both ``telemetry/step_health.py``, once per attempt.
  reward_hacking (grpo, ``train/reward_watch.py``): step, sign (fall|length|truncation|kl), and for a
  fall the reward (the falling function's name), before and after (its window means). hang: phase
  (load|train|wrapup), nodes (list of {node_rank, host, heartbeat_age_s, step, silent}) and
  silent_nodes with several nodes. memory_pressure: trigger (near_capacity|swing), figures
  {peak_mb, reserved_mb, capacity_mb, previous_peak_mb?}, remedy_set (config keys -> values:
  half micro-batch, same global batch; null at micro-batch 1), remedy_env (the allocator's
  expandable_segments variable)
- ``probe_results``: phase (before|after), passed, total, rate (0..1), results (list of
  {prompt, expected, answer, ok, set}), sets (optional: set name -> {passed, total, rate}, when
  the probes name sets, e.g. the demo's identity and control probes; also in summary.json), device (before: where the answers were generated, e.g.
  ``cuda:0`` or ``cpu``; every rank asks them there, rank 0 writes the event), reused (true: a resumed
  attempt's copy of an earlier attempt's "before" answers, not asked again; ``held_out`` before likewise),
  stopped (true: a stop request ended the answers early, one-process runs; total counts those answered)
- ``rank_memory``: written by every rank (not only rank 0): rank, local_rank, node_rank, phase
  (loaded: the model is built, sharded and on its device; trained: training is over, before the
  final save; finished: after the final save and the probes), vmhwm_mb (the rank process's peak resident set size so far, ``VmHWM`` from
  /proc/self/status, MiB; null where /proc is absent). Host RAM at load time, per rank: the figure
  that shows whether ZeRO-3 / FSDP2 loading held a full copy of the model on every rank.
  parameters_held (phase trained, a vision-language model only): {vision|projector|language: {local, global}},
  the parameter elements of each part this rank holds (a ZeRO-3 partition plus what is gathered, an FSDP2
  shard, or the whole under DDP) of the part's whole (cockpit/train/vlm_ranks.py)
- stage metrics (non-SFT stages, ``cockpit/train/recipes/``): extra fields of ``step`` from the
  trainer's logs at each logging step. dpo (all pref_loss values) and kto: reward_margin,
  reward_chosen, reward_rejected (mean implicit rewards beta * log(pi / pi_ref) of the batch's
  chosen / rejected answers; ORPO / SimPO: beta * the policy's log-prob, no reference),
  reward_accuracy (0..1, the fraction of pairs whose chosen reward exceeds the rejected one);
  kto also kl. rm: pairwise_accuracy (0..1), reward_margin, mean_reward (value-head scores).
  ``eval`` carries the same names prefixed ``eval_`` when a held-out set is evaluated.
  grpo (TRL GRPOTrainer's logs, averaged over the logging window; ``recipes/grpo.GRPO_FIELDS``): reward
  and reward_std (the weighted total reward of the sampled completions: mean, spread), rewards (a mapping
  reward function name -> {mean, std}), reward_zero_std_frac (0..1: groups whose completions all scored
  the same: no learning signal), kl (to the reference; only with beta > 0), entropy (mean per-token, nats),
  clip_ratio / clip_ratio_low / clip_ratio_high (0..1: tokens whose policy ratio was clipped, both sides /
  below / above), completion_len_mean, completion_len_min, completion_len_max (tokens), completion_truncated (0..1: the share
  cut at max_completion_length)
- ``completions`` (grpo, rank 0, each logging step): step, samples (a list of at most 4 of the latest
  sampled completions: prompt (the last user turn, at most 300 characters), completion (at most 600),
  reward (the weighted total, as the step's ``reward`` averages it), rewards (function name -> reward),
  advantage). The Live screen's completions pane and ``cockpit attach`` show them
- ``held_out``: phase (before|after), stage, pairs, accuracy (0..1: the policy's summed log-prob of
  the chosen answer beats the rejected one (dpo), or the value head scores it higher (rm)),
  mean_logp_margin (dpo) or mean_reward_margin (rm); grpo: prompts, mean_reward (the weighted total
  reward of greedy completions of the held-out prompts, max_completion_length tokens), rewards (function
  name -> mean), samples (up to 3 of {prompt, completion, reward})
- ``progress``: task (probes|held_out), phase (before|after: training), done, total, stage (held_out:
  the run's stage; grpo's held-out work is prompts to reward, not pairs) (rank 0, while
  the ranks work outside training steps: the probes' answers (a batch at a time) and DPO / RM's
  held-out scoring (a pair at a time, at most every few seconds); ``done`` 0 when the task begins
  and ``total`` when it ends; while a batch of probes generates, every ~2 s, also tokens and max_tokens:
  the batch's tokens so far). Readers show it ("asking probes before training 8/20") and time the
  steps from the end of the "before" tasks (``cockpit.run.pace``); the watchdog counts the "after"
  ones as progress, like ``predict_progress``
- ``predict_progress``: done, total (prediction samples generated so far; rank 0, at most every
  few seconds while ``do_predict`` generates; the hang watchdog counts it as progress)
- ``predict``: samples, bleu_4, rouge_1, rouge_2, rouge_l (LLaMA-Factory's predict_bleu-4 / rouge
  scores, 0..100, the mean over the samples), runtime_s, predictions (the path of
  generated_predictions.jsonl), results (predict_results.json), adapter (the adapter that answered:
  this run's, or a prediction-only run's adapter_name_or_path), stopped (true when a stop request
  ended it early: the scores are of the samples done); also in summary.json as ``predict``
- ``telemetry``: backend (amdsmi|nvml|torch|cpu), devices (list of {index, name, vram_used_mb,
  vram_total_mb, util_pct, temp_c, power_w}; empty on the CPU), ranks (list of {rank, pid, alive,
  rss_mb, cpu_pct}: the rank process's resident set size in MiB, its CPU use in percent of one
  core since the previous sample, can exceed 100; null for the first sample of a pid and for a
  process that is gone, alive false), unavailable (optional: backend -> why it was not used),
  node_rank and host (the node sampled, numbered like every node_rank in the events by the
  rendezvous' group rank, i.e. the order the nodes joined: the supervisor's own; logs before
  ``node_telemetry`` also hold other nodes' GPUs relayed by global rank 0 with source "node_reporter")
- ``comm``: backend (nccl|rccl|gloo), version (null for gloo), world_size, status (ok|probe
  failed|...), source (nccl_log for events parsed from the ranks' NCCL/RCCL INFO lines), details.
  The health probe's (rank 0, once at train start) details: probe {ok, backend, world_size,
  iters, results: list of {size_bytes, time_us (mean per all-reduce, slowest rank),
  algbw_gbps, busbw_gbps (GB/s = 10**9 bytes/s; busbw = algbw * 2(n-1)/n), ok}}, info {backend,
  library, version, world_size, rank, torch, ...}, env (the NCCL/RCCL/gloo variables set)
- ``run_finished``: steps, runtime_s (wall time over every attempt of the run, the pauses between
  attempts left out: :func:`wall_time_s`), tokens_per_s, first_loss, last_loss (the run's first and
  last logged training loss, unrounded), first_loss_step, last_loss_step (the steps they were logged
  at: the same step when only one was logged), mfu (summary.json's)
- ``run_failed``: reason, rank (optional), log_tail (list of lines)
- ``run_stopped``: reason, step
- ``stop_requested``: by (who asked: "cockpit stop", "cockpit UI", "Ctrl-C in cockpit train", ...); written by
  the one asking, when the stop request is made. The supervisor answers with a ``state`` event "stopping"
  (status.json too); the ranks save a checkpoint at the end of the step and end, without the probes after
  training (``cockpit chat RUN --probes`` asks them later)
- ``activity``: text (what the ranks do outside a logged step: "preparing the data", "loading the model",
  "first step running (1/36)", "step 3/36 trained (no loss logged yet)", "evaluating at step 6", "saving
  checkpoint-6", "saving the model"; the supervisor's "starting the ranks (importing torch and
  transformers)"; rank 0). Readers show it until the next ``step``, ``progress`` or ``activity`` event, an
  ``eval``, a checkpoint saved or the training's end (``cockpit.run.pace``)
"""

from __future__ import annotations

import errno
import json
import math
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1

KINDS = frozenset(
    {
        "run_started",
        "state",
        "rank_started",
        "train_begin",
        "train_end",
        "heartbeat",
        "heartbeats",
        "node_telemetry",
        "step",
        "eval",
        "checkpoint_saved",
        "alert",
        "probe_results",
        "held_out",
        "completions",
        "progress",
        "predict_progress",
        "predict",
        "rank_memory",
        "telemetry",
        "comm",
        "run_finished",
        "run_failed",
        "run_stopped",
        "stop_requested",
        "activity",
    }
)


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: encode them as strings so the line stays valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def as_float(value: Any) -> float | None:
    """Read back a number written by :func:`_clean` ("nan" -> nan)."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def encode(kind: str, **fields: Any) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    event = {"v": SCHEMA_VERSION, "t": round(time.time(), 3), "kind": kind}
    event.update(fields)
    return json.dumps(_clean(event), ensure_ascii=False, separators=(",", ":")) + "\n"


class EventWriter:
    """Appends events to ``events.jsonl``; one ``os.write`` per event."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def emit(self, kind: str, **fields: Any) -> None:
        """Append one line. A short write (the disk filled mid-line) is taken back and raised as
        ENOSPC, so readers never meet half a JSON line."""
        data = encode(kind, **fields).encode("utf-8")
        written = os.write(self._fd, data)
        if written < len(data):
            try:
                os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            except OSError:
                pass
            raise OSError(errno.ENOSPC, f"no space left for an event in {self.path}")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> EventWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventReader:
    """Reads only the bytes appended since the last call; a partial last line waits."""

    def __init__(self, path: str | os.PathLike[str], offset: int = 0):
        self.path = Path(path)
        self.offset = offset
        self._pending = b""
        self.bad_lines = 0

    def read_new(self, max_bytes: int | None = None) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read() if max_bytes is None else fh.read(max_bytes)
        except FileNotFoundError:
            return []
        if not chunk:
            return []
        self.offset += len(chunk)
        data = self._pending + chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()  # b"" when data ended with a newline
        events = []
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                self.bad_lines += 1
                continue
            if isinstance(event, dict) and "kind" in event:
                events.append(event)
            else:
                self.bad_lines += 1
        return events


def scan_kinds(
    path: str | os.PathLike[str], kinds: Iterable[str], offset: int = 0, chunk_bytes: int = 1 << 20
) -> Iterator[dict[str, Any]]:
    """The events of the given kinds from ``offset`` on, read in chunks: memory stays at a few
    chunks (the chunk, its copy and its lines: about 5x) however long the log, and only lines that name one of the kinds are parsed (a reader looking
    for a run's final event in a million-step log parsed every step into memory: 330 MB)."""
    wanted = set(kinds)
    needles = [k.encode() for k in wanted]
    pending = b""
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return
    with fh:
        fh.seek(offset)
        while chunk := fh.read(chunk_bytes):
            lines = (pending + chunk).split(b"\n")
            pending = lines.pop()
            for line in lines:
                if not any(n in line for n in needles):
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("kind") in wanted:
                    yield event


def read_all(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    return EventReader(path).read_new()


def wall_time_s(events: list[dict[str, Any]], until: float | None = None) -> float:
    """A run's wall time over its attempts: each attempt from its first event to the ``state``
    event that ended it (a terminal state), the pause before a resume left out; ``until`` extends
    the last attempt while it runs (now)."""
    from cockpit.store.rundir import TERMINAL_STATES

    spans: list[list[float]] = []
    ended = True
    for ev in events:
        t = as_float(ev.get("t"))
        if t is None:
            continue
        if ended:
            spans.append([t, t])
        spans[-1][1] = max(spans[-1][1], t)
        ended = ev.get("kind") == "state" and ev.get("state") in TERMINAL_STATES
    if spans and until is not None and not ended:
        spans[-1][1] = max(spans[-1][1], until)
    return sum(b - a for a, b in spans)


def iter_kind(events: list[dict[str, Any]], kind: str) -> Iterator[dict[str, Any]]:
    return (e for e in events if e.get("kind") == kind)
