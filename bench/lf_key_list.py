"""The names of every LLaMA-Factory 0.9.5 config key, read from its own argument dataclasses (issue 37).

    python bench/lf_key_list.py     # builds the side venv (bench/lf_venv.py) and re-runs itself there
    python bench/lf_key_list.py --dry-run   # what it would write and run; no LLaMA-Factory

A LLaMA-Factory training YAML is parsed by ``HfArgumentParser`` into ``ModelArguments``, ``DataArguments``,
``TrainingArguments`` (HF's ``Seq2SeqTrainingArguments`` plus LLaMA-Factory's Ray / profiler / FP8 fields),
``FinetuningArguments`` (with its nested Freeze / LoRA / OFT / RLHF / GaLore / APOLLO / BAdam / SwanLab
classes) and ``GeneratingArguments``. Every field of those classes is written, sorted, to
``tests/fixtures/llamafactory/lf_keys.json`` with the class that declares it (the most-derived class of the
MRO that has it in its own annotations), and the LLaMA-Factory and transformers versions.
``tests/test_lf_key_verdicts.py`` checks that Cockpit gives each name a verdict (it works, or it is
refused by name with a reason), without this venv. The v1 trainer's keys (``USE_V1=1``) go to
``tests/fixtures/llamafactory/lf_v1_keys.json`` (``tests/test_lf_v1.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "llamafactory" / "lf_keys.json"


def _declared_by(cls: type, name: str) -> str:
    """The class of ``cls``'s MRO whose own annotations declare ``name`` (LLaMA-Factory's nested classes)."""
    for base in cls.__mro__:
        if name in base.__dict__.get("__annotations__", {}):
            return base.__name__
    return cls.__name__


def generate() -> dict:
    import llamafactory
    import transformers
    from llamafactory.hparams import (
        DataArguments,
        FinetuningArguments,
        GeneratingArguments,
        ModelArguments,
        TrainingArguments,
    )

    keys: dict[str, dict[str, str]] = {}
    for parsed in (ModelArguments, DataArguments, TrainingArguments, FinetuningArguments, GeneratingArguments):
        for f in dataclasses.fields(parsed):
            if not f.init or f.name.startswith("_"):
                continue  # set in __post_init__, never read from a YAML
            declared = _declared_by(parsed, f.name)
            hf = declared in {c.__name__ for c in transformers.Seq2SeqTrainingArguments.__mro__}
            keys.setdefault(
                f.name,
                {
                    "parsed_by": parsed.__name__,
                    "declared_in": declared,
                    "origin": "transformers" if hf else "llamafactory",
                },
            )
    return {
        "llamafactory": llamafactory.__version__,
        "transformers": transformers.__version__,
        "made_by": "bench/lf_key_list.py",
        "keys": dict(sorted(keys.items())),
    }


V1_OUT = OUT.with_name("lf_v1_keys.json")


def generate_v1() -> dict:
    """The fields of the v1 trainer's argument classes (``USE_V1=1``; cockpit/config/lf_v1.py reads such files)."""
    import llamafactory
    from llamafactory.v1.config.data_args import DataArguments
    from llamafactory.v1.config.model_args import ModelArguments
    from llamafactory.v1.config.sample_args import SampleArguments
    from llamafactory.v1.config.training_args import TrainingArguments

    keys = {
        f.name: parsed.__name__
        for parsed in (ModelArguments, DataArguments, TrainingArguments, SampleArguments)
        for f in dataclasses.fields(parsed)
        if f.init and not f.name.startswith("_")
    }
    return {"llamafactory": llamafactory.__version__, "made_by": "bench/lf_key_list.py", "keys": keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="say what would be written and run; no LLaMA-Factory")
    args = ap.parse_args()
    if args.dry_run or importlib.util.find_spec("llamafactory") is None:  # not the side venv: run this file with its python
        sys.path.insert(0, str(ROOT / "bench"))
        from lf_venv import rerun_in_side_venv

        if args.dry_run:
            print(f"would write {OUT.relative_to(ROOT)} and {V1_OUT.relative_to(ROOT)}")
        return rerun_in_side_venv(__file__, [], dry_run=args.dry_run)
    data = generate()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    V1_OUT.write_text(json.dumps(generate_v1(), indent=1) + "\n", encoding="utf-8")
    by_origin: dict[str, int] = {}
    for entry in data["keys"].values():
        by_origin[entry["origin"]] = by_origin.get(entry["origin"], 0) + 1
    print(f"{len(data['keys'])} keys {by_origin} -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
