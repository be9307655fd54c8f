"""Logits only where the loss is (``cockpit.train.labelled_logits``): the LM head runs on the
positions whose next token carries a label, and the loss and gradients are the full forward's."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from cockpit.config.run_config import RunConfig  # noqa: E402
from cockpit.data.packing import build_collator  # noqa: E402
from cockpit.train.labelled_logits import (  # noqa: E402
    POSITIONS,
    WithLabelledPositions,
    accepts_logits_to_keep,
    labelled_positions_only,
)


def _rows(vocab: int, lengths: list[int], seed: int = 2) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    rows = []
    for n in lengths:
        ids = [rng.randrange(3, vocab) for _ in range(n)]
        prompt = max(1, (2 * n) // 3)  # a long prompt: most positions carry no label
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    model.config.use_cache = False
    return model, tok


def _loss_and_grads(model, batch, n_items):
    model.zero_grad(set_to_none=True)
    seen = []
    hook = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[1]))
    loss = model(**batch, num_items_in_batch=n_items).loss
    hook.remove()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, seen[0]


@pytest.mark.parametrize("packing", [False, True])
def test_the_lm_head_on_labelled_positions_gives_the_full_loss_and_gradients(tiny, packing):
    model, tok = tiny
    model.train()
    rows = _rows(len(tok), [23, 40, 9])
    batch = build_collator(RunConfig(packing=packing), tok, model)(rows)
    n_items = int((batch["labels"] != -100).sum())
    full_loss, full_grads, full_len = _loss_and_grads(model, batch, n_items)
    cut = labelled_positions_only(batch)
    assert "logits_to_keep" in cut
    loss, grads, kept_len = _loss_and_grads(model, cut, n_items)
    # the prompts' logits were never computed (padded: the union of the rows' answer positions)
    assert kept_len < (0.5 if packing else 0.7) * full_len
    assert loss == pytest.approx(full_loss, rel=1e-6)
    assert grads.keys() == full_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, full_grads[name], atol=1e-6, rtol=1e-5, msg=name)


def test_nothing_to_skip_leaves_the_batch_alone(tiny):
    model, tok = tiny
    assert accepts_logits_to_keep(model)
    ids = torch.arange(3, 19)[None]
    every = {"input_ids": ids, "labels": ids.clone()}  # pretraining: every position has a target
    assert labelled_positions_only(every) is every
    assert labelled_positions_only({"input_ids": ids}) == {"input_ids": ids}


def test_cockpit_trainer_trains_like_the_stock_trainer(tiny, tiny_model_dir, tmp_path):
    """Three optimizer steps of CockpitTrainer (labelled logits, the chunked loss) and HF's Trainer
    (every logit) on the same padded batches: the same losses and the same weights. Plain SGD, so a
    weight differs by the learning rate times its gradients' difference: Adam divides each gradient by
    its own running scale, and a tied embedding row whose gradient is ~1e-10 flips sign with the
    summation order (one OpenMP thread against two), moving that row by the whole learning rate."""
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from cockpit.train.arguments import ListDataset
    from cockpit.train.trainer import CockpitTrainer

    _, tok = tiny
    rows = _rows(len(tok), [12, 31, 18, 27, 40, 15, 22, 35, 10], seed=5)
    results = []
    for cls in (Trainer, CockpitTrainer):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
        model.config.use_cache = False
        args = TrainingArguments(output_dir=str(tmp_path / cls.__name__), per_device_train_batch_size=3, max_steps=3,
                                 learning_rate=1e-2, lr_scheduler_type="constant", logging_steps=1, save_strategy="no", optim="sgd",
                                 report_to=[], use_cpu=True, seed=0, disable_tqdm=True)
        trainer = cls(model=model, args=args, train_dataset=ListDataset(rows),
                      data_collator=build_collator(RunConfig(packing=False), tok, model), processing_class=tok)
        trainer.train()
        results.append(([h["loss"] for h in trainer.state.log_history if "loss" in h], model))
    (stock_losses, stock), (losses, ours) = results
    assert losses == pytest.approx(stock_losses, abs=1e-5) and len(losses) == 3
    for (name, a), (_, b) in zip(stock.named_parameters(), ours.named_parameters()):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4, msg=name)


def test_the_training_batches_bring_their_positions_from_the_host(tiny, tiny_model_dir, tmp_path):
    """The positions are found by the training collator, on the host (``nonzero`` on a device tensor
    waits for the device: bench/host_syncs.py), and give the same cut as finding them in the step;
    evaluation batches carry none."""
    from transformers import TrainingArguments

    from cockpit.train.arguments import ListDataset
    from cockpit.train.trainer import CockpitTrainer

    model, tok = tiny
    rows = _rows(len(tok), [23, 40, 9])
    collate = build_collator(RunConfig(packing=False), tok, model)
    batch = WithLabelledPositions(collate)(rows)
    keep = batch.pop(POSITIONS)
    assert keep.device.type == "cpu" and 0 < keep.numel() < batch["labels"].shape[1] - 1
    by_host, in_step = labelled_positions_only(batch, keep), labelled_positions_only(batch)
    assert torch.equal(by_host["logits_to_keep"], in_step["logits_to_keep"])
    assert torch.equal(by_host["labels"], in_step["labels"])
    ids = torch.arange(3, 19)[None]
    every = WithLabelledPositions(lambda _: {"input_ids": ids, "labels": ids.clone()})(None)
    assert every[POSITIONS].numel() == 0  # every position has a target: the full logits
    plain = {"input_ids": ids, "labels": ids.clone()}
    assert labelled_positions_only(plain, every[POSITIONS]) is plain
    args = TrainingArguments(output_dir=str(tmp_path / "t"), per_device_train_batch_size=3, max_steps=1,
                             report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no")
    trainer = CockpitTrainer(model=model, args=args, train_dataset=ListDataset(rows), eval_dataset=ListDataset(rows),
                             data_collator=collate, processing_class=tok)
    assert POSITIONS in next(iter(trainer.get_train_dataloader()))
    assert POSITIONS not in next(iter(trainer.get_eval_dataloader()))
    assert trainer.data_collator is collate  # lent to the training loader only
