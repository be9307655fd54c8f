"""KTO's KL pairs as LLaMA-Factory builds them (cockpit/train/kto_pairs.py): each prompt with another
row's answer, over the dataset, so one sample per micro-batch trains (LLaMA-Factory's own kto example)."""

from __future__ import annotations

import json

import pytest

from cockpit.errors import InputError


def test_kl_rotation_gives_each_row_the_previous_rows_answer():
    from cockpit.train.kto_pairs import kl_rotation

    assert kl_rotation(["a0", "a1", "a2", "a3"]) == ["a3", "a0", "a1", "a2"]  # LLaMA-Factory's +1 offset
    assert kl_rotation([[1, 2], [3]]) == [[3], [1, 2]]
    assert kl_rotation([]) == []


def _rows(n: int) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"Question {i}?"}],
            "completion": [{"role": "assistant", "content": f"Answer number {i}."}],
            "label": i % 2 == 0,
        }
        for i in range(n)
    ]


def test_one_sample_per_micro_batch_pairs_each_prompt_with_another_rows_answer(tmp_path, tiny_model_dir):
    """TRL's KTOTrainer refuses per_device_train_batch_size 1 (its in-batch rotation would give a row its
    own answer); here it builds, and each row's KL sequence is its prompt with the previous row's answer."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import KTOConfig

    from cockpit.train.kto_pairs import DatasetKLTrainer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)), LoraConfig(r=4, target_modules="all-linear")
    )
    args = KTOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=1,
        use_cpu=True,
        max_length=64,
        train_sampling_strategy="sequential",
        report_to=[],
    )
    n = 5
    trainer = DatasetKLTrainer(model=model, args=args, train_dataset=Dataset.from_list(_rows(n)), processing_class=tok)
    assert trainer.args.per_device_train_batch_size == 1 and trainer._train_batch_size == 1
    ds = trainer.train_dataset
    completions, kl = list(ds["completion_ids"]), list(ds["KL_completion_ids"])
    for i in range(n):
        assert kl[i] == completions[i - 1] != completions[i]
        assert tok.decode(kl[i]).startswith(f"Answer number {(i - 1) % n}.")
    batches = list(trainer.get_train_dataloader())
    assert len(batches) == n
    for i, batch in enumerate(batches):  # one sample each; its KL sequence: this prompt, the previous row's answer
        assert batch["input_ids"].shape[0] == batch["KL_input_ids"].shape[0] == 1
        text = tok.decode(batch["KL_input_ids"][0][batch["KL_attention_mask"][0].bool()])
        assert f"Question {i}?" in text and f"Answer number {(i - 1) % n}." in text and f"Answer number {i}." not in text


def test_a_kto_dataset_of_one_row_is_refused(tmp_path):
    from cockpit.config.run_config import RunConfig
    from cockpit.data.stage_data import collect_stage_samples

    (tmp_path / "kto.jsonl").write_text(json.dumps({"instruction": "Q", "output": "A", "kto_tag": True}) + "\n")
    info = {"one": {"file_name": "kto.jsonl", "columns": {"prompt": "instruction", "response": "output", "kto_tag": "kto_tag"}}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(InputError, match="stage kto needs 2 or more rows"):
        collect_stage_samples(RunConfig.from_mapping({"stage": "kto", "dataset": "one", "dataset_dir": str(tmp_path)}))
