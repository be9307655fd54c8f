"""do_predict + predict_with_generate (LLaMA-Factory's prediction, issue 18): the BLEU-4 / ROUGE
scorer against hand-checked figures, the config's rules (each names its key), the Summary's lines,
and real runs through the CLI (slow: train then predict, and a prediction-only run on that adapter)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.config import validate
from cockpit.errors import InputError


# -- the scorer (LLaMA-Factory's ComputeSimilarity) ------------------------------------------------
def test_identical_texts_score_100_on_every_metric():
    from cockpit.data.similarity import sample_scores

    assert sample_scores("今天天气很好，我们去公园散步。", "今天天气很好，我们去公园散步。") == {
        "rouge-1": 100.0, "rouge-2": 100.0, "rouge-l": 100.0, "bleu-4": 100.0}
    assert sample_scores("The cat sat on the mat.", "The cat sat on the mat.")["bleu-4"] == 100.0


def test_chinese_is_scored_by_jieba_words_and_bleu_by_characters():
    """jieba cuts 我爱北京天安门 as 我|爱|北京|天安门 but 我爱北京故宫 as 我|爱|北京故宫, so by words the
    two share 我, 爱 only: ROUGE-1 P 2/4, R 2/3, F 4/7 = 57.1429 (by characters it would share 4 of
    7 / 6: 61.54); ROUGE-2: 1 shared bigram (我爱) of 3 / 2: F 0.4; ROUGE-L: LCS 2 words, as ROUGE-1.
    BLEU-4 by characters: 4/7, 3/6, 2/5, 1/4 n-gram precisions, no brevity penalty (the prediction
    is longer): (4/7 * 1/2 * 2/5 * 1/4) ** (1/4) = 41.1134."""
    from cockpit.data.similarity import sample_scores

    scores = sample_scores("我爱北京天安门", "我爱北京故宫")
    assert scores == {"rouge-1": 57.1429, "rouge-2": 40.0, "rouge-l": 57.1429, "bleu-4": 41.1134}


def test_an_empty_prediction_scores_0_and_the_mean_is_over_samples():
    from cockpit.data.similarity import mean_scores, sample_scores

    assert sample_scores("", "一个答案") == {"rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0, "bleu-4": 0.0}
    assert sample_scores("   ", "an answer")["rouge-1"] == 0.0  # nothing left after segmentation
    both = mean_scores([("我爱北京天安门", "我爱北京故宫"), ("", "一个答案")])
    assert both == {"bleu-4": 20.5567, "rouge-1": 28.5714, "rouge-2": 20.0, "rouge-l": 28.5714}
    assert mean_scores([]) == {"bleu-4": 0.0, "rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0}


def test_the_prompt_is_the_conversation_before_the_last_reply():
    from cockpit.train.predict import split_conversation

    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
             {"role": "user", "content": "name?"}, {"role": "assistant", "content": "Cockpit"}]
    assert split_conversation(turns) == (turns[:3], "Cockpit")
    assert split_conversation(turns[:1]) == (turns[:1], "")


def test_decoding_is_greedy_unless_do_sample():
    from cockpit.train.predict import generation_kwargs

    cfg = validate({"dataset": "cockpit_identity", "max_new_tokens": 32, "top_k": 5})
    assert generation_kwargs(cfg) == {"max_new_tokens": 32, "repetition_penalty": 1.0, "do_sample": False,
                                      "temperature": None, "top_p": None, "top_k": None}
    assert generation_kwargs(cfg.replace(do_sample=True)) == {"max_new_tokens": 32, "repetition_penalty": 1.0,
                                                             "do_sample": True, "temperature": 0.95, "top_p": 0.7,
                                                             "top_k": 5}


def test_prediction_progress_restarts_the_hang_watchdogs_clock():
    from cockpit.run.supervisor import observe_progress
    from cockpit.run.watchdog import HangWatchdog

    dog = HangWatchdog(floor_s=10, start_t=0, load_timeout_s=100)
    observe_progress(dog, {"kind": "predict_progress", "t": 90.0, "done": 8, "total": 50})
    assert dog.check(150, ranks_alive=True) is None  # 60 s since the last batch, not 150 since the start
    assert dog.check(191, ranks_alive=True)["code"] == "hang"


# -- the config's rules ----------------------------------------------------------------------------
def _adapter(tmp_path: Path) -> Path:
    folder = tmp_path / "run" / "adapter"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    return folder


def refused(match: str, **cfg):
    with pytest.raises(InputError, match=match):
        validate({"dataset": "cockpit_identity", **cfg})


def test_llamafactorys_predict_example_is_accepted(tmp_path):
    cfg = validate({"stage": "sft", "do_predict": True, "finetuning_type": "lora", "eval_dataset": "cockpit_bilingual",
                    "template": "chatml", "cutoff_len": 2048, "max_samples": 50, "per_device_eval_batch_size": 1,
                    "predict_with_generate": True, "do_train": False, "adapter_name_or_path": str(_adapter(tmp_path))})
    assert cfg.do_predict and not cfg.do_train and cfg.max_new_tokens == 1024 and cfg.do_sample is False
    assert validate({"dataset": "cockpit_identity", "val_size": 2, "do_predict": True, "predict_with_generate": True})


def test_each_bad_prediction_config_names_its_key(tmp_path, monkeypatch):
    refused("do_predict: needs predict_with_generate: true", do_predict=True, val_size=2)
    refused("predict_with_generate: applies with do_predict: true", predict_with_generate=True)
    refused("do_predict: needs data to predict on: set eval_dataset", do_predict=True, predict_with_generate=True)
    refused("do_train: only a prediction run skips training", do_train=False)
    refused("adapter_name_or_path: a prediction-only run .* set adapter_name_or_path",
            do_train=False, do_predict=True, predict_with_generate=True)
    with pytest.raises(InputError, match="eval_dataset: a prediction-only run needs data to predict on"):
        validate({"do_train": False, "do_predict": True, "predict_with_generate": True,
                  "adapter_name_or_path": str(_adapter(tmp_path))})
    refused("nproc_per_node: a prediction-only run generates in one process", do_train=False, do_predict=True,
            predict_with_generate=True, adapter_name_or_path=str(tmp_path / "run" / "adapter"), nproc_per_node=2)
    refused("do_predict: rank 0 generates alone", do_predict=True, predict_with_generate=True, val_size=2,
            fsdp="full_shard", nproc_per_node=2)
    refused("do_predict: prediction answers with an SFT model", stage="pt", do_predict=True, predict_with_generate=True,
            val_size=2)
    refused("num_beams: a LLaMA-Factory key that Cockpit refuses: a decoding option", num_beams=4)
    from cockpit.config import parity

    real = parity.has_module
    monkeypatch.setattr(parity, "has_module", lambda name: name != "rouge_chinese" and real(name))
    refused("do_predict: scoring the predictions needs the rouge-chinese package", do_predict=True,
            predict_with_generate=True, val_size=2)


def test_a_run_dir_given_as_the_adapter_is_refused_with_its_adapter_folder(tmp_path):
    from cockpit.config.run_config import RunConfig
    from cockpit.preflight.checks import adapter_problems

    adapter = _adapter(tmp_path)
    cfg = RunConfig(do_train=False, adapter_name_or_path=str(adapter.parent))
    (problem,) = adapter_problems(cfg)
    assert problem.key == "adapter_name_or_path" and f"did you mean {adapter}?" in problem.message
    assert adapter_problems(cfg.replace(adapter_name_or_path=str(adapter))) == []


# -- the Summary -------------------------------------------------------------------------------------
def test_summary_shows_the_scores_the_samples_and_the_file(tmp_path):
    from cockpit.store.rundir import RunDir
    from cockpit.ui.screens.summary import summary_text

    predict = {"samples": 12, "bleu_4": 41.11339, "rouge_1": 57.1429, "rouge_2": 40.0, "rouge_l": 57.1429,
               "predictions": "/out/generated_predictions.jsonl", "stopped": False}
    text = summary_text(RunDir(tmp_path), {"state": "finished", "steps": 0, "predict": predict,
                                           "adapter_name_or_path": "/runs/a/adapter"}, {}).plain
    assert "predict (12 samples): BLEU-4 41.11  ROUGE-1 57.14  ROUGE-2 40.00  ROUGE-L 57.14" in text
    assert "predictions: /out/generated_predictions.jsonl" in text
    assert "predicted with the adapter /runs/a/adapter" in text
    assert "predict (" not in summary_text(RunDir(tmp_path), {"state": "finished", "predict": None}, {}).plain


# -- real runs ---------------------------------------------------------------------------------------
def _check_outputs(run: Path, out: Path, samples: int) -> dict:
    from conftest import read_events

    lines = [json.loads(line) for line in (out / "generated_predictions.jsonl").read_text().splitlines()]
    assert len(lines) == samples
    assert all(set(row) == {"prompt", "predict", "label"} and all(isinstance(v, str) for v in row.values())
               for row in lines)
    assert all(row["label"] and "<|im_start|>assistant" in row["prompt"] for row in lines)  # chatml's generation prompt
    summary = json.loads((run / "summary.json").read_text())
    predict = summary["predict"]
    assert predict["samples"] == samples and predict["predictions"] == str(out / "generated_predictions.jsonl")
    for key in ("bleu_4", "rouge_1", "rouge_2", "rouge_l"):
        assert isinstance(predict[key], (int, float)) and 0 <= predict[key] <= 100, (key, predict[key])
    results = json.loads((out / "predict_results.json").read_text())
    assert {k: results[f"predict_{k.replace('_', '-')}"] for k in ("bleu_4", "rouge_1", "rouge_2", "rouge_l")} == {
        k: predict[k] for k in ("bleu_4", "rouge_1", "rouge_2", "rouge_l")}
    (event,) = [e for e in read_events(run) if e["kind"] == "predict"]
    assert event["samples"] == samples and event["bleu_4"] == predict["bleu_4"]
    return summary


@pytest.mark.slow
def test_train_then_predict_and_predict_only_on_that_adapter(tmp_path, tiny_model_dir):
    """(a) training with do_predict predicts the val_size split with the trained adapter; (b) a run
    with do_train: false predicts eval_dataset with (a)'s adapter/ folder, through the real CLI."""
    from conftest import TINY_CONFIG, cockpit, tiny_config, write_yaml

    runs = tmp_path / "runs"
    cfg = tiny_config(tmp_path, tiny_model_dir, "train", max_steps=2, val_size=3, do_predict=True,
                      predict_with_generate=True, max_new_tokens=6, per_device_eval_batch_size=2, probes=None)
    res = cockpit("train", str(cfg), "--runs-dir", str(runs), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (trained,) = runs.iterdir()
    summary = _check_outputs(trained, trained, 3)
    assert summary["state"] == "finished" and summary["steps"] == 2
    assert summary["predict"]["adapter"] == str(trained / "adapter")

    predict_only = {k: v for k, v in TINY_CONFIG.items() if k != "dataset"}  # LLaMA-Factory's example: eval_dataset alone
    cfg = write_yaml(tmp_path / "predict.yaml", {
        "model_name_or_path": str(tiny_model_dir), **predict_only, "do_train": False, "do_predict": True,
        "predict_with_generate": True, "adapter_name_or_path": str(trained / "adapter"),
        "eval_dataset": "cockpit_bilingual", "max_samples": 4, "max_new_tokens": 6,
        "output_dir": str(tmp_path / "predict_out")})
    res = cockpit("train", str(cfg), "--runs-dir", str(runs), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (predicted,) = [r for r in runs.iterdir() if r != trained]
    summary = _check_outputs(predicted, tmp_path / "predict_out", 4)
    assert summary["state"] == "finished" and summary["steps"] == 0
    assert summary["probes_after"]["total"] == 10  # the tiny config's probes, answered by the adapter
    assert json.loads((predicted / "status.json").read_text())["state"] == "finished"
