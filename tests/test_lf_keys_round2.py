"""Issue 37, LLaMA-Factory keys that work now: ``pure_bf16`` (bf16 weights, gradients and optimizer states,
no autocast), ``early_stopping_steps`` (HF's EarlyStoppingCallback, as LLaMA-Factory adds it),
``include_effective_tokens_per_second`` (LLaMA-Factory's calculate_tps in the train metrics) and
LLaMA-Factory's predict-only configs (``eval_dataset`` without ``dataset``)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import cockpit, read_events, tiny_config


def cfg_for(model_dir: Path, **over):
    from cockpit.config import validate

    return validate({"model_name_or_path": str(model_dir), "dataset": "cockpit_identity", "use_cpu": True,
                     "template": "chatml", "lora_rank": 4, "lora_alpha": 8, "cutoff_len": 64, **over})


def refused(match: str, **over):
    from cockpit.config import validate
    from cockpit.errors import InputError

    with pytest.raises(InputError, match=match):
        validate({"dataset": "cockpit_identity", **over}, check_paths=False)


# -- pure_bf16 ---------------------------------------------------------------------------------------
def test_pure_bf16_refuses_what_it_cannot_train_with():
    refused("fp16: pure_bf16 trains in bf16 and fp16 is another precision", pure_bf16=True, fp16=True)
    refused("pure_bf16: pure_bf16 is not supported with zero_stage", pure_bf16=True, zero_stage=3)
    refused("pure_bf16: pure_bf16 is not supported with fsdp", pure_bf16=True, fsdp="full_shard", nproc_per_node=2)


@pytest.mark.parametrize("finetuning_type", ["full", "lora"])
def test_pure_bf16_trains_bf16_weights_and_optimizer_states_without_autocast(tmp_path, tiny_model_dir,
                                                                             finetuning_type):
    """Cockpit's own path (build_model, training_arguments, sft_trainer): the model loads in bf16, the
    Trainer runs without autocast (args.bf16 false), and after two optimizer steps every trainable
    parameter, its gradient and its Adam moments are bf16, the loss finite."""
    import torch

    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model
    from cockpit.train.arguments import training_arguments
    from cockpit.train.model import build_model
    from cockpit.train.recipes.sft import sft_trainer
    from cockpit.train.trainer import CockpitTrainer

    cfg = cfg_for(tiny_model_dir, finetuning_type=finetuning_type, pure_bf16=True, bf16=True, max_steps=2,
                  per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1, save_strategy="no")
    ref = resolve_model(cfg.model_name_or_path, log=lambda *_: None)
    tok = load_tokenizer(cfg, ref, log=lambda *_: None)
    model = build_model(cfg, ref, True, 0)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}  # base and (LoRA) adapter alike
    args = training_arguments(cfg, {"checkpoints": tmp_path / "ck"}, True, 1)
    assert args.bf16 is False and args.fp16 is False  # no autocast: bf16: true gives way to pure_bf16
    rows = [{"input_ids": r.input_ids, "labels": r.labels} for r in prepare_dataset(cfg, tok).trainable][:8]
    trainer = sft_trainer(CockpitTrainer, cfg, model, args, tok, rows)
    out = trainer.train()
    assert math.isfinite(out.training_loss) and out.global_step == 2
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.bfloat16 for p in trained)
    states = [trainer.optimizer.state[p] for p in trained if p in trainer.optimizer.state]
    assert len(states) == len(trained)
    assert all(s["exp_avg"].dtype == torch.bfloat16 and s["exp_avg_sq"].dtype == torch.bfloat16 for s in states)
    assert any(s["exp_avg"].abs().sum() > 0 for s in states)  # the states were updated


def test_pure_bf16_loads_in_bf16_and_counts_two_bytes_a_weight_in_the_plan():
    import torch

    from cockpit.config import validate
    from cockpit.models.resolve import ModelRef
    from cockpit.plan.host import load_bytes_per_param
    from cockpit.train.model import base_load_kwargs, trainable_in_fp32

    def Ref():  # a local folder: no hub arguments
        return ModelRef(path="model")

    for ft in ("full", "freeze", "lora"):
        cfg = validate({"dataset": "cockpit_identity", "finetuning_type": ft, "pure_bf16": True}, check_paths=False)
        assert base_load_kwargs(cfg, Ref(), True, 0)["dtype"] == torch.bfloat16
        assert not trainable_in_fp32(cfg) and load_bytes_per_param(cfg, True) == 2
        plain = validate({"dataset": "cockpit_identity", "finetuning_type": ft}, check_paths=False)
        assert base_load_kwargs(plain, Ref(), True, 0)["dtype"] == torch.float32


# -- early_stopping_steps ----------------------------------------------------------------------------
def test_early_stopping_refuses_what_hfs_callback_would():
    refused("early_stopping_steps: needs evaluation data to watch: set val_size or eval_dataset",
            early_stopping_steps=2)
    refused("early_stopping_steps: stops on the evaluations during training, and this config has none",
            early_stopping_steps=2, val_size=2, do_eval=False)
    refused("early_stopping_steps: needs a metric to watch: set metric_for_best_model",
            early_stopping_steps=2, val_size=2)
    refused("early_stopping_steps: stage dpo evaluates during training only when asked", stage="dpo",
            early_stopping_steps=2, val_size=2, metric_for_best_model="loss")
    refused("early_stopping_steps: .*grpo", stage="grpo", early_stopping_steps=2, val_size=2,
            load_best_model_at_end=True, reward_funcs="cockpit.train.rewards:length")
    refused("early_stopping_steps: expected an integer >= 1|early_stopping_steps: .*>= 1", early_stopping_steps=0,
            val_size=2, load_best_model_at_end=True)
    from cockpit.config import validate

    for ok in ({"load_best_model_at_end": True}, {"metric_for_best_model": "loss"}):
        assert validate({"dataset": "cockpit_identity", "val_size": 2, "early_stopping_steps": 2, **ok},
                        check_paths=False).early_stopping_steps == 2


def test_effective_tokens_per_second_is_llamafactorys_calculate_tps():
    """sft / pt rows (the ListDataset both trainers train on): every sample's input_ids x epochs / the
    train runtime / the ranks, as LLaMA-Factory's calculate_tps; other stages refuse the key."""
    from cockpit.config.stages import STAGES
    from cockpit.train.arguments import ListDataset
    from cockpit.train.stopping import effective_tokens_per_sec

    rows = ListDataset([{"input_ids": [1] * n, "labels": [1] * n} for n in (10, 20, 30)])
    assert effective_tokens_per_sec(rows, 2.0, 4.0, 1) == 30.0  # 60 tokens x 2 epochs / 4 s
    assert effective_tokens_per_sec(rows, 2.0, 4.0, 2) == 15.0 and effective_tokens_per_sec(rows, 1, 0.0, 1) is None
    assert [s for s, caps in STAGES.items() if caps.honours("include_effective_tokens_per_second")] == ["sft", "pt"]
    refused("include_effective_tokens_per_second: .*stage dpo|stage dpo.*include_effective_tokens_per_second",
            stage="dpo", include_effective_tokens_per_second=True)


@pytest.mark.slow
def test_a_run_whose_eval_loss_stops_improving_ends_early_and_says_why(tmp_path, tiny_model_dir):
    """A real run (tiny model, CLI): eval every step on a val_size split, a learning rate that makes the
    eval loss climb after the first steps, early_stopping_steps 2 with load_best_model_at_end: the run ends
    (finished) well before max_steps, two evaluations after its best, the reason in summary.json, the log
    and an info alert; include_effective_tokens_per_second puts LLaMA-Factory's figure in summary.json."""
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=30, learning_rate=1.0, val_size=4, eval_steps=1,
                      save_steps=1, load_best_model_at_end=True, early_stopping_steps=2, probes=None,
                      include_effective_tokens_per_second=True, save_total_limit=None)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    run = next((tmp_path / "runs").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    evals = [e for e in read_events(run) if e["kind"] == "eval"]
    assert summary["state"] == "finished" and summary["steps"] < 30, summary
    losses = [e["eval_loss"] for e in evals]
    best = losses.index(min(losses))
    assert len(losses) == best + 3 and all(x >= losses[best] for x in losses[best + 1:]), losses
    assert [e["step"] for e in evals] == list(range(1, summary["steps"] + 1))
    assert summary["reason"].startswith(f"early stopping at step {summary['steps']}: eval_loss has not improved "
                                        "for 2 evaluation(s) (early_stopping_steps 2; best")
    assert summary["reason"].endswith(f" at checkpoint-{evals[best]['step']})"), summary["reason"]
    (alert,) = [e for e in read_events(run) if e["kind"] == "alert" and e.get("code") == "early_stopping"]
    assert alert["level"] == "info" and alert["message"] == summary["reason"]
    assert "early stopping at step" in (run / "logs" / "rank0.log").read_text()
    # load_best_model_at_end: the saved adapter is the best checkpoint's, not the last step's (HF named the
    # best while it was staged, and quietly loaded nothing: fixed in CockpitTrainer._save_checkpoint)
    from safetensors.torch import load_file

    best_dir = run / "checkpoints" / f"checkpoint-{evals[best]['step']}"
    last_dir = run / "checkpoints" / f"checkpoint-{summary['steps']}"
    state = json.loads((last_dir / "trainer_state.json").read_text())
    assert state["best_model_checkpoint"] == str(best_dir)
    final, at_best, at_last = (load_file(str(d / "adapter_model.safetensors")) for d in (run / "adapter", best_dir, last_dir))
    assert all(final[k].equal(at_best[k]) for k in at_best)
    assert any(not final[k].equal(at_last[k]) for k in at_last)
    # LLaMA-Factory's calculate_tps: the training samples' tokens x epochs / train runtime
    tps = summary["effective_tokens_per_sec"]
    assert isinstance(tps, float) and tps > 0
    assert tps > summary["tokens_per_s"] * 0.05  # the same order as the step events' measure


# -- predict-only with eval_dataset alone -----------------------------------------------------------
LF_PREDICT = """\
### model
model_name_or_path: {model}
adapter_name_or_path: {adapter}
trust_remote_code: true

### method
stage: sft
do_predict: true
finetuning_type: lora

### dataset
eval_dataset: cockpit_identity
template: chatml
cutoff_len: 2048
max_samples: 50
preprocessing_num_workers: 1

### output
output_dir: {out}
report_to: none

### eval
per_device_eval_batch_size: 1
predict_with_generate: true
ddp_timeout: 180000000
"""


def test_llamafactorys_predict_example_passes_check_with_eval_dataset_alone(tmp_path, tiny_model_dir):
    """LLaMA-Factory's examples/extras/nlg_eval/*_lora_predict.yaml shape (no dataset, no do_train: HF's
    default is false there): `cockpit check` accepts it as a prediction-only run on eval_dataset, and
    says so; with do_train: true it still needs a dataset."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                   LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(adapter)
    path = tmp_path / "predict.yaml"
    path.write_text(LF_PREDICT.format(model=tiny_model_dir, adapter=adapter, out=tmp_path / "out"), encoding="utf-8")
    res = cockpit("check", str(path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "do_train: false (do_predict with eval_dataset and no dataset" in res.stdout + res.stderr
    from cockpit.config import load_config
    from cockpit.config.parity import predict_data_key

    cfg = load_config(str(path))
    assert not cfg.dataset and cfg.eval_dataset == "cockpit_identity" and not cfg.do_train
    assert predict_data_key(cfg.mapping()) == "eval_dataset"
    refused("dataset: required", do_train=True, dataset=None, do_predict=True, predict_with_generate=True,
            eval_dataset="cockpit_identity")


@pytest.mark.slow
def test_a_predict_only_run_predicts_on_eval_dataset_without_dataset(tmp_path, tiny_model_dir):
    """The same file trains nothing and predicts eval_dataset's samples (the real CLI)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                   LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(adapter)
    path = tmp_path / "predict.yaml"
    text = LF_PREDICT.format(model=tiny_model_dir, adapter=adapter, out=tmp_path / "out")
    path.write_text(text.replace("max_samples: 50", "max_samples: 3") + "max_new_tokens: 4\n"
                    "use_cpu: true\n", encoding="utf-8")
    res = cockpit("train", str(path), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    lines = (tmp_path / "out" / "generated_predictions.jsonl").read_text().splitlines()
    assert len(lines) == 3
    run = next((tmp_path / "runs").iterdir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["steps"] == 0 and summary["predict"]["samples"] == 3
