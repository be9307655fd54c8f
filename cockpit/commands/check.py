"""``cockpit check CONFIG [--set k=v ...] [--json]``: validate config and data, no training."""

from __future__ import annotations

import argparse
import json

from cockpit.commands.common import (
    EXIT_OK,
    add_config_args,
    add_runs_dir,
    config_from_args,
    label_flag_problems,
    print_input_error,
    runs_dir,
)
from cockpit.data.media import image_report_lines
from cockpit.errors import InputError


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_config_args(p, flag_form=True)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-devices", action="store_true", help="skip the checks against this machine's devices")
    add_runs_dir(p)  # an output_dir another run of it writes is refused


def run(args: argparse.Namespace) -> int:
    from cockpit.preflight.checks import check_run
    from cockpit.run.shared_output import refuse_shared_output

    try:
        cfg = config_from_args(args)
        refuse_shared_output(cfg, runs_dir(args), args.config)
        result = check_run(cfg, log=(lambda *_: None) if args.json else print, with_devices=not args.no_devices)
    except InputError as err:
        label_flag_problems(err, args)
        if args.json:
            print(json.dumps({"ok": False, "problems": [str(p) for p in err.problems]}, ensure_ascii=False))
        return print_input_error(err, args)
    if args.json:
        print(json.dumps(result.as_dict(), ensure_ascii=False))
        return EXIT_OK
    print(f"config: {args.config or 'command-line flags'} OK")
    print(f"model: {result.model_path}")
    print("datasets: " + ", ".join(f"{k} ({v})" for k, v in result.formats.items()))
    if result.template:
        print(f"template: {result.template}")
    for line in result.report.lines():
        print(line)
    for line in image_report_lines(result.images):  # the data's images (issue 63)
        print(line)
    if cfg.stage == "sft":
        from cockpit.data.padding import batching_words

        print(f"batches: {result.batches or batching_words(cfg)}")  # the model asked (check_run)
    for p in result.bad_rows:
        print(f"skipped bad row: {p}")
    for w in result.warnings:
        print(f"warning: {w}")
    return EXIT_OK
