"""``cockpit tune CONFIG [--set k=v ...] [--memory-cap GB] [--gpus N] [--candidates 1,2,4] [--steps N]
[--out PATH] [--json]``: the micro-batch that fits and runs fastest, by short real training steps.

Exit 0: a micro-batch fits, the tuned config is written; 1: nothing fits (or a trial failed);
2: bad input (the message names the key or option). Progress goes to stderr; the table (or the
one JSON document with --json) to stdout. The search itself: :mod:`cockpit.train.tune`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from cockpit.commands.common import EXIT_FAILED, EXIT_OK, add_config_args, print_input_error
from cockpit.errors import InputError

EPILOG = """\
The global batch (per_device_train_batch_size x gradient_accumulation_steps x ranks) stays fixed:
each candidate micro-batch m divides the per-device share and runs with accumulation share/m.
Every candidate runs a few real optimizer steps in this one process (the first is a warm-up, left out
of the timing), smallest first; an out-of-memory is caught and the search stops upward. A candidate
fits when its measured peak leaves 10% of the cap free (the planner's headroom); the fastest that
fits (tokens/s) is written to a new config, <config>.tuned.yaml by default.

Memory: on a GPU the allocator's peak (torch.cuda.max_memory_allocated) against the device memory,
or --memory-cap (enforced as the process's memory fraction). On the CPU the peak of live tensor bytes
(as in cockpit plan's measurement) against --memory-cap (default: the available RAM); going over it
raises the same out-of-memory error a GPU would.

Several ranks: plain data parallel is trialled on one rank with the per-device share of the batch.
DeepSpeed (deepspeed, zero_stage) and FSDP configs are refused (exit 2): one process cannot show a
sharded rank's memory; use cockpit plan for those."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    add_config_args(p)
    p.add_argument(
        "--memory-cap",
        type=float,
        default=None,
        metavar="GB",
        help="memory of one device in GiB (default: the device's memory; on the CPU the available RAM)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        metavar="N",
        help="data-parallel size on one node (overrides nproc_per_node / nnodes)",
    )
    p.add_argument(
        "--candidates",
        default=None,
        metavar="1,2,4,8",
        help="micro-batches to try; each must divide the per-device batch "
        "(default: its power-of-two divisors and the config's own micro-batch)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=3,
        metavar="N",
        help="optimizer steps per candidate, the first a warm-up (default 3, at least 2)",
    )
    p.add_argument(
        "--out", default=None, metavar="PATH", help="the tuned config (default: <config>.tuned.yaml beside it)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")


def _size(gb: float | None) -> str:
    from cockpit.commands.plan import _fmt
    from cockpit.plan.estimate import GiB

    return "-" if gb is None else _fmt(gb * GiB).strip()


def render(doc: dict[str, Any]) -> str:
    lines = [
        f"{doc['config']}: global batch {doc['global_batch']} ({doc['per_device_batch']} per device x "
        f"{doc['world']} rank{'s' if doc['world'] > 1 else ''}), cap {_size(doc['cap_gb'])} on {doc['device']}, "
        f"{doc['steps']} steps per candidate (the first untimed)",
        "",
    ]
    head = ("micro-batch", "accumulation", "peak measured", "planned", "tokens/s", "result")
    rows = [head]
    for t in doc["trials"]:
        result = {
            "fits": "fits",
            "tight": f"tight (<{doc['headroom']:.0%} free)",
            "oom": "OOM",
            "skipped": "not tried (a smaller one OOMed)",
        }[t["status"]]
        rows.append(
            (
                str(t["micro_batch"]),
                str(t["accumulation"]),
                _size(t["peak_gb"]),
                _size(t["planned_gb"]),
                "-" if t["tokens_per_s"] is None else f"{t['tokens_per_s']:.1f}",
                result,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        lines.append("  " + "  ".join(c.rjust(w) if i < 5 else c for i, (c, w) in enumerate(zip(r, widths))))
    lines += ["", ("chose: " if doc["ok"] else "") + doc["message"]]
    if doc["out"]:
        lines.append(f"wrote: {doc['out']}")
    lines.append(
        "planned: cockpit plan's tensor peak at full cutoff_len; the trial steps run the data's longest samples"
    )
    return "\n".join(lines)


@contextlib.contextmanager
def stdout_to_stderr():
    """Whatever the libraries print while the trials run (DeepSpeed's accelerator notice, the
    Trainer's metrics) goes to stderr, at the file-descriptor level: stdout is the table / JSON only."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run(args: argparse.Namespace) -> int:
    from cockpit.train.tune import parse_candidates, tune

    def log(msg: str) -> None:
        print(f"cockpit tune: {msg}", file=sys.stderr, flush=True)

    try:
        with stdout_to_stderr():
            doc = tune(
                args.config,
                args.overrides,
                memory_cap_gb=args.memory_cap,
                gpus=args.gpus,
                candidates=parse_candidates(args.candidates),
                steps=args.steps,
                out=args.out,
                log=log,
            )
    except InputError as err:
        if args.json:
            print(
                json.dumps(
                    {"ok": False, "out": None, "problems": [str(p) for p in err.problems], "message": str(err)},
                    ensure_ascii=False,
                )
            )
        return print_input_error(err)
    except Exception as exc:  # noqa: BLE001 - a trial failed for another reason than memory
        import traceback

        traceback.print_exc()
        msg = f"a trial failed: {type(exc).__name__}: {exc}"
        if args.json:
            print(json.dumps({"ok": False, "out": None, "message": msg}, ensure_ascii=False))
        print(f"cockpit tune: {msg}", file=sys.stderr)
        return EXIT_FAILED
    print(json.dumps(doc, indent=2, ensure_ascii=False) if args.json else render(doc))
    return EXIT_OK if doc["ok"] else EXIT_FAILED
