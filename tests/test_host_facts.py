"""The training step reads its batch's token count and packed-sample bounds from the host
(``cockpit.train.host_facts``), not back from the device: bench/host_syncs.py's counter over real steps of
CockpitTrainer finds no host read of Cockpit's own and none in HF's token count (issue 53: no host sync in the
step), and the tokens seen are HF's own count."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))


def _rows(vocab: int, n: int, seed: int = 4) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids = [rng.randrange(3, vocab) for _ in range(rng.randrange(8, 30))]
        out.append({"input_ids": ids, "labels": [-100] * 3 + ids[3:]})
    return out


def _trainer(cls, tiny_model_dir, tmp_path, rows, packing: bool):
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainingArguments

    from cockpit.config.load import validate
    from cockpit.data.packing import batching_arguments, build_collator
    from cockpit.train.arguments import ListDataset
    from cockpit.train.model import over_base

    run = validate({"dataset": "x", "finetuning_type": "lora", "lora_target": "all", "packing": packing,
                    "per_device_train_batch_size": 3, "use_cpu": True})  # fmt: skip
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    torch.manual_seed(0)
    model = over_base(run)(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32))
    args = TrainingArguments(output_dir=str(tmp_path / f"{cls.__name__}{packing}"), per_device_train_batch_size=3,
                             max_steps=5, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no",
                             logging_steps=1, logging_nan_inf_filter=False,  # as a run's (train/arguments.py)
                             **batching_arguments(run))  # fmt: skip
    return cls(model=model, args=args, train_dataset=ListDataset(rows), processing_class=tok,
               data_collator=build_collator(run, tok, model))  # fmt: skip


@pytest.mark.parametrize("packing", [True, False], ids=["padding-free", "padded"])
def test_a_cockpit_step_reads_nothing_of_its_own_back_from_the_device(tiny_model_dir, tmp_path, packing):
    from host_syncs import SyncCounter, count
    from transformers import Trainer

    from cockpit.train.trainer import CockpitTrainer

    rows = _rows(500, 15)
    stock = _trainer(Trainer, tiny_model_dir, tmp_path, rows, packing)
    stock.train()
    trainer = _trainer(CockpitTrainer, tiny_model_dir, tmp_path, rows, packing)
    counter = SyncCounter("cpu")  # on the CPU every read counts (on a GPU these tensors would be the device's)
    try:
        steps, sites = count(trainer, counter, warmup=1)
    finally:
        counter.restore()
    assert steps == 4
    ours = {site: n for site, n in sites.items() if " cockpit." in site or "_track_num_input_tokens" in site}
    assert not ours, ours  # before host_facts: packed_attention's tolist and HF's token .item() every step
    assert trainer.state.num_input_tokens_seen == stock.state.num_input_tokens_seen > 0
    if packing:  # what is left: transformers' check whether the row is packed (one read a step)
        assert set(sites) == {s for s in sites if "find_packed_sequence_indices" in s} and sum(sites.values()) == steps


def test_the_host_facts_are_what_the_device_tensors_say(tiny_model_dir):
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq, DataCollatorWithFlattening

    from cockpit.train.host_facts import BOUNDS, TOKENS, WithHostFacts

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = _rows(500, 3)
    flat = WithHostFacts(
        DataCollatorWithFlattening(return_position_ids=True, separator_id=-100, return_flash_attn_kwargs=True),
        "all",
        tok.pad_token_id,
    )(rows)
    assert flat[TOKENS] == flat["input_ids"].numel() == sum(len(r["input_ids"]) for r in rows)
    assert flat[BOUNDS] == flat["cu_seq_lens_q"].tolist()
    padded = WithHostFacts(
        DataCollatorForSeq2Seq(tok, padding=True, label_pad_token_id=-100), "non_padding", tok.pad_token_id
    )(rows)
    assert padded[TOKENS] == int(padded["attention_mask"].sum()) < padded["input_ids"].numel() and BOUNDS not in padded


def test_a_collator_that_hands_rows_on_as_a_list_is_left_as_it_is():
    """GRPO's collator returns the rows themselves (the trainer tokenizes them while it samples): no facts to
    add, and the list reaches the trainer unchanged (a ``.get`` on it failed every GRPO run)."""
    from cockpit.train.host_facts import WithHostFacts

    rows = [{"prompt": [{"role": "user", "content": "q"}], "answer": "a"}]
    assert WithHostFacts(lambda features: features, "all", 0)(rows) is rows
