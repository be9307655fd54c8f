"""``cockpit export RUN [--merge] [--out DIR]``: the adapter, or the base model with it merged."""

from __future__ import annotations

import argparse
import json

from cockpit.commands.common import EXIT_OK, add_runs_dir, find_run, print_input_error
from cockpit.errors import InputError


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run")
    add_runs_dir(p)
    p.add_argument("--merge", action="store_true", help="merge the LoRA adapter into the base model (safetensors)")
    p.add_argument("--out", default=None, help="output folder (default: <output>/merged or <output>/export)")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="merged weights' dtype (auto: the run's precision: bf16 for a bf16 run, fp16 for an fp16 QLoRA run, else float32)",
    )
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace) -> int:
    import contextlib
    import sys

    from cockpit.serve.export import export_run

    # with --json, stdout carries the JSON alone: library chatter goes to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    try:
        with quiet:
            record = export_run(
                find_run(args), args.out, merge=args.merge, dtype=args.dtype, log=lambda *a: print(*a, file=sys.stderr)
            )
    except InputError as err:
        return print_input_error(err)
    if args.json:
        print(json.dumps(record, indent=1))
    else:
        print(f"exported {record['kind']} of {record['run_id']} to {record['path']}")
        for n in record["notes"]:
            print(f"note: {n}")
    return EXIT_OK
