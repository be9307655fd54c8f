"""Which of LLaMA-Factory's own example configs pass Cockpit's check, with the model swapped for the embedded
one (issue 37).

    git -C LF_CLONE archive v0.9.5 examples data | tar -x -C /tmp/lf095
    python bench/lf_examples_check.py /tmp/lf095 [--only PATTERN]

For every YAML under ``ROOT/examples`` that is a training config (v0: ``stage`` / ``do_train`` / ``dataset``;
v1: cockpit/config/lf_v1.py's keys), ``model_name_or_path`` (v1: ``model``) becomes
``smollm2-135m-instruct`` and the config goes through ``load_config`` and ``check_run`` (config, tokenizer,
every data row; no device checks) from ``ROOT`` as the working dir, as ``llamafactory-cli train`` reads its
relative paths. Prints one line per file (PASS, or the first line of the refusal) and the counts; inference,
merge and accelerate files are counted as not training configs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

EMBEDDED = "smollm2-135m-instruct"


def kind(raw: dict) -> str | None:
    from cockpit.config import lf_v1

    if lf_v1.is_v1(raw):
        return "v1"
    if any(k in raw for k in ("stage", "do_train", "dataset")):
        return "v0"
    return None


def check_one(path: Path, workdir: Path) -> str | None:
    """None when the config passes, else the first line of what Cockpit says."""
    from cockpit.config import load_config
    from cockpit.errors import InputError
    from cockpit.preflight.checks import check_run

    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    raw["model" if kind(raw) == "v1" else "model_name_or_path"] = EMBEDDED
    with tempfile.TemporaryDirectory() as tmp:
        swapped = Path(tmp) / path.name
        swapped.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
        try:
            cfg = load_config(swapped)
            check_run(cfg, log=lambda *_: None, with_devices=False)
        except InputError as err:
            return " | ".join(str(p).replace(str(swapped), path.name).splitlines()[0] for p in err.problems)[:400]
        except Exception as err:  # noqa: BLE001 (a library's own error: reported, not hidden)
            return f"{type(err).__name__}: {err}".splitlines()[0][:400]
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path, help="a LLaMA-Factory tree with examples/ and data/")
    ap.add_argument("--only", default="", help="only paths containing this")
    args = ap.parse_args()
    root = args.root.resolve()
    os.chdir(root)
    counts = {"pass": 0, "fail": 0, "not training": 0}
    for path in sorted((root / "examples").rglob("*.yaml")):
        rel = path.relative_to(root)
        if args.only not in str(rel):
            continue
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict) or kind(raw) is None:
            counts["not training"] += 1
            continue
        why = check_one(path, root)
        counts["pass" if why is None else "fail"] += 1
        print(f"{'PASS' if why is None else 'FAIL'} {rel}" + (f": {why}" if why else ""), flush=True)
    total = counts["pass"] + counts["fail"]
    print(f"{counts['pass']} of {total} training configs pass ({counts['not training']} other files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
