"""Issue 37: LLaMA-Factory's own example configs (tests/fixtures/llamafactory/, only the model swapped for the
embedded one) train through the plain ``cockpit train`` on the CPU: 2 steps each, with the CPU's sizes given
by ``--set`` (``max_steps``, ``cutoff_len``, one micro-batch per step, no data-loader workers, fp32). ``bench/lf_examples_check.py`` runs ``cockpit
check``'s validation over all of LLaMA-Factory 0.9.5's examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from conftest import cockpit, read_events

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "llamafactory"


@pytest.mark.slow
@pytest.mark.parametrize("name, stage", [("sft", "sft"), ("dpo", "dpo"), ("kto", "kto"), ("pretrain", "pt"), ("reward", "rm")])
def test_a_llamafactory_example_trains_two_steps_on_the_cpu(name, stage, tmp_path):
    over = ["max_steps=2", "cutoff_len=128", "gradient_accumulation_steps=1", "dataloader_num_workers=0",
            "preprocessing_num_workers=1", "use_cpu=true", "bf16=false", "save_steps=2", "logging_steps=1", "probes=null"]
    res = cockpit("train", str(FIXTURES / f"qwen3_lora_{name}.yaml"), "--runs-dir", str(tmp_path / "runs"),
                  *[a for o in over for a in ("--set", o)], cwd=str(tmp_path), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    assert [e["step"] for e in read_events(run) if e["kind"] == "step"] == [1, 2]
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["stage"] == stage and saved["finetuning_type"] == "lora" and saved["lora_target"] == "all"
