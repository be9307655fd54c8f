"""A training rank: ``python -m cockpit.train.worker RUN_DIR`` (under torchrun for several).

The process: its log, its ``rank_started`` event, node telemetry, the stage's recipe
(:func:`cockpit.train.recipes.run_stage`, on the resolved config in ``RUN_DIR/config.yaml``),
failures turned into events (an out-of-memory alert with its remedies), and a clean exit. What a
rank trains with is in ``train/arguments.py``, ``train/model.py``, ``train/distributed.py`` and
``train/outcome.py``; rank 0 writes the step, probe, checkpoint and final events and
``summary.json``; every rank obeys stop/save requests through :class:`CockpitCallback`. Never
imports textual.

Exit codes: 0 finished or stopped on request, 1 training failed, 2 invalid input.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from pathlib import Path

import yaml

from cockpit.config.run_config import RunConfig
from cockpit.device import VISIBLE_VARS
from cockpit.errors import EXIT_FAILED, EXIT_INPUT, InputError
from cockpit.store.events import EventWriter
from cockpit.store.rundir import RunDir

OOM_REMEDIES = [
    "lower per_device_train_batch_size and raise gradient_accumulation_steps (same global batch)",
    "gradient_checkpointing: true",
    "a shorter cutoff_len",
    "ZeRO-3 / FSDP across more devices, or QLoRA (quantization_bit: 4)",
    "cockpit plan CONFIG tells what fits before launch",
]
_OOM_TEXT = (
    "out of memory",
    "can't allocate memory",
    "cannot allocate memory",
    "hip out of memory",
    "cuda out of memory",
)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return any(t in str(exc).lower() for t in _OOM_TEXT)


def dist_env() -> tuple[int, int, int]:
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_RANK", 0))


def load_run_config(run: RunDir) -> RunConfig:
    return RunConfig.from_resolved(yaml.safe_load(run.config_path.read_text(encoding="utf-8")))


def _close_process_group() -> None:
    """Destroy this rank's process group before the interpreter exits: a gloo group left to
    interpreter teardown can abort the rank (``terminate called without an active exception``)
    when its peer has already closed the connections, turning a finished run into a failed one."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the run's result is already written; report and go on
        print(f"process group teardown: {type(exc).__name__}: {exc}", flush=True)


def main(run_path: str) -> int:
    from cockpit.train.private_memory import PEAK

    PEAK.start()  # the rank's private-memory peak, for its rank_memory events
    run = RunDir(Path(run_path))
    rank, world_size, local_rank = dist_env()
    if world_size > 1:  # under torchrun: this rank's output goes to its own log file
        fd = os.open(run.rank_log(rank), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    writer: EventWriter | None  # None on the ranks but 0, after rank_started
    writer = EventWriter(run.events_path)
    writer.emit(
        "rank_started",
        rank=rank,
        local_rank=local_rank,
        pid=os.getpid(),
        node_rank=int(os.environ.get("GROUP_RANK", 0)),
        host=socket.gethostname(),
        visible_devices={k: os.environ[k] for k in VISIBLE_VARS if k in os.environ},
    )
    if rank != 0:
        writer.close()
        writer = None
    cfg = load_run_config(run)
    from cockpit.telemetry.torch_backend import start_node_telemetry

    # every node's GPUs and heartbeat, through the rendezvous store (local rank 0 of each node)
    start_node_telemetry(
        cfg.telemetry_interval_s,
        cfg.nnodes,
        rank,
        local_rank,
        int(os.environ.get("GROUP_RANK", 0)),
        socket.gethostname(),
        EventWriter(run.events_path).emit if rank == 0 else None,
    )
    t0 = time.time()
    try:
        from cockpit.train.recipes import run_stage

        code = run_stage(run, cfg, rank, world_size, local_rank, writer, t0)
        from cockpit.telemetry import node as node_telemetry

        node_telemetry.finish()
        _close_process_group()
        return code
    except InputError as exc:
        if writer:
            writer.emit("run_failed", reason=f"invalid input: {exc}", rank=rank)
        print(f"cockpit: invalid input: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except Exception as exc:  # noqa: BLE001 - reported, with the traceback in the rank's log
        traceback.print_exc()
        reason = f"{type(exc).__name__}: {exc}"
        if is_oom(exc):
            reason = f"out of memory in rank {rank}: {reason}"
            if writer:
                writer.emit(
                    "alert",
                    level="error",
                    code="oom",
                    message=reason[:500],
                    remedies=OOM_REMEDIES,
                    rank=rank,
                )
        if writer:
            writer.emit("run_failed", reason=reason[:2000], rank=rank)
        return EXIT_FAILED


def exit_rank(code: int) -> None:
    """Leave the process once the run's results are written, skipping the interpreter's and C++'s
    static teardown (freeing every module and tensor: ~1.5 s of a single-process CPU run, measured
    between the rank's ``run_finished`` and its exit). A single process first runs Python's exit
    handlers (a logger's or a tracker's flush). Several ranks skip those too: there a gloo/TCPStore
    background thread still joinable at teardown aborts the rank ("terminate called without an
    active exception", exit -6) and torchrun reports a finished run as failed (a finished two-rank
    DDP run was reported failed in CI with rank 0's training done; not reproduced in 6 runs here)."""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        import atexit

        atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_rank(main(sys.argv[1]))
