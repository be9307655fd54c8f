"""The LM loss without the full logits (``cockpit.train.chunked_loss``): chunk by chunk, with the
logits recomputed in backward, and the same loss and gradients as the model's own loss."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from cockpit.config.run_config import RunConfig  # noqa: E402
from cockpit.data.packing import build_collator  # noqa: E402
from cockpit.train.chunked_loss import (  # noqa: E402
    chunked_cross_entropy_sum,
    lm_loss_without_logits,
    plain_lm_head,
)
from cockpit.train.labelled_logits import labelled_positions_only  # noqa: E402

REL = 1e-5  # the bound; measured: loss within ~2e-7, gradients within ~1e-6 (relative to the largest)


def _rows(vocab: int, lengths: list[int], seed: int = 2) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    rows = []
    for n in lengths:
        ids = [rng.randrange(3, vocab) for _ in range(n)]
        prompt = max(1, (2 * n) // 3)  # a long prompt: the labelled positions are worth cutting to
        rows.append({"input_ids": ids, "labels": [-100] * prompt + ids[prompt:]})
    return rows


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def _model(tiny_model_dir, *, tied: bool = True, lora: bool = False):
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(tiny_model_dir), tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), config=cfg, dtype=torch.float32)
    if not tied:  # a head of its own, not the embedding's copy
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * 0.05)
    model.config.use_cache = False
    if lora:
        from peft import LoraConfig, get_peft_model

        # B random too (init_lora_weights=False): every LoRA weight gets a gradient worth comparing
        model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False))
    model.train()
    return model


def _loss_and_grads(model, batch, n_items, head=None, chunk=256):
    model.zero_grad(set_to_none=True)
    extra = {} if n_items is None else {"num_items_in_batch": n_items}
    if head is None:
        loss = model(**batch, **extra).loss
    else:
        with lm_loss_without_logits(model, head, chunk):
            out = model(**batch, **extra)
        assert out.logits.shape[-1] != model.config.vocab_size  # the logits were never made
        loss = out.loss
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(got, want):
    (loss, grads), (ref_loss, ref_grads) = got, want
    assert loss == pytest.approx(ref_loss, rel=REL)
    assert grads.keys() == ref_grads.keys() and grads
    for name, g in grads.items():
        ref = ref_grads[name]
        # relative to the tensor's largest entry: entries near zero carry rounding, not signal
        assert (g - ref).abs().max().item() <= REL * ref.abs().max().item(), name


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("chunk", [8, 4096], ids=["chunks", "one-chunk"])
def test_the_chunked_loss_gives_the_full_logits_loss_and_gradients(tiny_model_dir, tok, packing, tied, lora, chunk):
    model = _model(tiny_model_dir, tied=tied, lora=lora)
    head, why = plain_lm_head(model)
    assert head is not None, why
    rows = _rows(len(tok), [23, 40, 9])
    batch = build_collator(RunConfig(packing=packing), tok, model)(rows)
    n_items = int((batch["labels"] != -100).sum())
    full = _loss_and_grads(model, batch, n_items)  # every logit
    cut = labelled_positions_only(batch)  # today's training path: logits at the labelled positions only
    assert "logits_to_keep" in cut
    kept = cut["logits_to_keep"].numel() * cut["labels"].shape[0]
    assert chunk < kept if chunk == 8 else chunk > kept
    _assert_same(_loss_and_grads(model, cut, n_items, head, chunk), full)
    _assert_same(_loss_and_grads(model, batch, n_items, head, chunk), full)  # every position, chunked
    if not packing:  # no num_items_in_batch: the mean over labelled tokens, as HF's loss
        _assert_same(_loss_and_grads(model, cut, None, head, chunk), _loss_and_grads(model, batch, None))


def test_the_chunks_against_torch_cross_entropy_with_a_bias_and_ignored_rows():
    torch.manual_seed(1)
    h = torch.randn(37, 16, requires_grad=True)
    w = torch.randn(300, 16, requires_grad=True)
    b = torch.randn(300, requires_grad=True)
    t = torch.randint(0, 300, (37,))
    t[::4] = -100
    ref = torch.nn.functional.cross_entropy(h @ w.t() + b, t, reduction="sum")
    ref_grads = torch.autograd.grad(ref, (h, w, b))
    for chunk in (1, 5, 37, 100):
        got = chunked_cross_entropy_sum(h, w, b, t, chunk)
        assert got.item() == pytest.approx(ref.item(), rel=REL)
        for g, r in zip(torch.autograd.grad(got, (h, w, b)), ref_grads):
            assert (g - r).abs().max().item() <= REL * r.abs().max().item()
    frozen = torch.randn(300, 16)  # LoRA: the head's weight takes no gradient, none is made
    (gh,) = torch.autograd.grad(chunked_cross_entropy_sum(h, frozen, None, t, 8), (h,))
    (rh,) = torch.autograd.grad(torch.nn.functional.cross_entropy(h @ frozen.t(), t, reduction="sum"), (h,))
    assert (gh - rh).abs().max().item() <= REL * rh.abs().max().item()


def test_under_autocast_the_head_multiplies_in_the_autocast_dtype(tiny_model_dir, tok):
    """bf16 autocast (the Trainer's bf16 on fp32 weights): the head's matmul in bf16 as the model's,
    the loss in fp32; the same loss and gradients to bf16's precision."""
    model = _model(tiny_model_dir)
    head, _ = plain_lm_head(model)
    batch = build_collator(RunConfig(packing=False), tok, model)(_rows(len(tok), [23, 40, 9]))
    n_items = int((batch["labels"] != -100).sum())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        full = _loss_and_grads(model, batch, n_items)
        chunked = _loss_and_grads(model, batch, n_items, head, 8)
    assert chunked[0] == pytest.approx(full[0], rel=1e-3)
    for name, g in chunked[1].items():
        ref = full[1][name]
        assert (g - ref).abs().max().item() <= 2e-2 * ref.abs().max().item(), name


def _trainer(model, tok, tmp_path, rows, **args):
    from transformers import TrainingArguments

    from cockpit.train.arguments import ListDataset
    from cockpit.train.trainer import CockpitTrainer

    targs = TrainingArguments(output_dir=str(tmp_path / "t"), per_device_train_batch_size=3, max_steps=1,
                              report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no", **args)  # fmt: skip
    return CockpitTrainer(model=model, args=targs, train_dataset=ListDataset(rows),
                          data_collator=build_collator(RunConfig(packing=False), tok, model), processing_class=tok)  # fmt: skip


def test_what_keeps_the_full_logits(tiny_model_dir, tok, tmp_path):
    """Where the chunked loss would not be the model's own loss exactly, the logits stay."""
    from peft import LoraConfig, get_peft_model

    rows = _rows(len(tok), [12, 20, 30])
    assert plain_lm_head(_model(tiny_model_dir))[0] is not None
    on_head = get_peft_model(_model(tiny_model_dir, tied=False), LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    assert "not a plain Linear" in plain_lm_head(on_head)[1]
    saved = get_peft_model(_model(tiny_model_dir), LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    assert "ModulesToSaveWrapper" in plain_lm_head(saved)[1]
    capped = _model(tiny_model_dir)
    capped.config.final_logit_softcapping = 30.0
    assert "final_logit_softcapping" in plain_lm_head(capped)[1]
    probed = _model(tiny_model_dir)
    probed.lm_head.register_forward_hook(lambda *a: None)
    assert "hooks" in plain_lm_head(probed)[1]
    own = _model(tiny_model_dir)
    own.loss_function = lambda **kw: 0
    assert "own loss" in plain_lm_head(own)[1]

    from transformers import GraniteConfig, GraniteForCausalLM  # logits / logits_scaling before the loss

    granite = GraniteForCausalLM(GraniteConfig(vocab_size=128, hidden_size=16, intermediate_size=32,
                                               num_hidden_layers=1, num_attention_heads=2, logits_scaling=4.0))  # fmt: skip
    assert "not known" in plain_lm_head(granite)[1]

    trainer = _trainer(_model(tiny_model_dir), tok, tmp_path, rows)
    assert trainer._chunked_loss_head() is not None and trainer.chunked_loss_why_not == ""
    off = _trainer(_model(tiny_model_dir), tok, tmp_path, rows)
    off.chunked_loss = False
    assert off._chunked_loss_head() is None and "turned off" in off.chunked_loss_why_not
    smoothed = _trainer(_model(tiny_model_dir), tok, tmp_path, rows, label_smoothing_factor=0.1)
    assert not smoothed._labelled_logits_only()  # the label smoother reads the full logits: neither cut applies


def test_training_takes_the_chunked_path_and_evaluation_keeps_the_logits(tiny_model_dir, tok, tmp_path, monkeypatch):
    import cockpit.train.trainer as trainer_module

    entered = []
    real = trainer_module.lm_loss_without_logits

    def counting(*a, **k):
        entered.append(1)
        return real(*a, **k)

    monkeypatch.setattr(trainer_module, "lm_loss_without_logits", counting)
    rows = _rows(len(tok), [12, 20, 30])
    model = _model(tiny_model_dir)
    trainer = _trainer(model, tok, tmp_path, rows)
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    loss = trainer.compute_loss(model, dict(batch))
    assert entered == [1]
    trainer.chunked_loss, trainer._chunked_head = False, None
    assert trainer.compute_loss(model, dict(batch)).item() == pytest.approx(loss.item(), rel=REL)
    assert entered == [1]
    model.eval()  # evaluation and prediction read the logits: the model's own path
    plain = {k: v for k, v in batch.items() if k != "cockpit_labelled_positions"}
    _, logits, _ = trainer.prediction_step(model, plain, prediction_loss_only=False)
    assert logits.shape[-1] == model.config.vocab_size and entered == [1]
    assert vars(model.lm_head).get("forward") is None and "_loss_function" not in vars(model)  # nothing left behind


def test_cockpit_trainer_with_the_chunked_loss_trains_like_the_stock_trainer(tiny_model_dir, tok, tmp_path):
    """Three optimizer steps of CockpitTrainer (labelled positions, chunked loss) and HF's Trainer
    (every logit) on the same packed batches, LoRA with an untied head, gradient checkpointing: the
    same losses and weights."""
    from transformers import Trainer, TrainingArguments

    from cockpit.train.arguments import ListDataset
    from cockpit.train.trainer import CockpitTrainer

    rows = _rows(len(tok), [12, 31, 18, 27, 40, 15, 22, 35, 10], seed=5)
    results = []
    for cls in (Trainer, CockpitTrainer):
        model = _model(tiny_model_dir, tied=False, lora=True)
        args = TrainingArguments(output_dir=str(tmp_path / cls.__name__), per_device_train_batch_size=3, max_steps=3,
                                 learning_rate=1e-2, lr_scheduler_type="constant", logging_steps=1, save_strategy="no",
                                 report_to=[], use_cpu=True, seed=0, disable_tqdm=True, gradient_checkpointing=True)  # fmt: skip
        trainer = cls(model=model, args=args, train_dataset=ListDataset(rows),
                      data_collator=build_collator(RunConfig(packing=True), tok, model), processing_class=tok)  # fmt: skip
        trainer.train()
        if cls is CockpitTrainer:
            assert trainer._chunked_loss_head() is model.get_base_model().lm_head
        results.append(([h["loss"] for h in trainer.state.log_history if "loss" in h], model))
    (stock_losses, stock), (losses, ours) = results
    assert losses == pytest.approx(stock_losses, rel=REL) and len(losses) == 3
    for (name, a), (_, b) in zip(stock.named_parameters(), ours.named_parameters()):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4, msg=name)


def test_a_frozen_head_costs_two_matmuls_per_chunk_as_the_full_logits_do():
    """LoRA's case (the head's weight frozen): the gradient of the hidden states is made in forward,
    from the logits already there, so forward + backward do the head's matmul twice, as the full
    logits' path does, not three times (recomputing the logits in backward); the gradient is the same."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(3)
    n, hidden, vocab = 40, 16, 300
    h = torch.randn(n, hidden, requires_grad=True)
    w = torch.randn(vocab, hidden)
    t = torch.randint(0, vocab, (n,))
    t[::3] = -100
    one_matmul = 2 * n * hidden * vocab
    with FlopCounterMode(display=False) as frozen:
        (gh,) = torch.autograd.grad(chunked_cross_entropy_sum(h, w, None, t, 8) * 0.5, (h,))
    assert frozen.get_total_flops() == 2 * one_matmul
    (rh,) = torch.autograd.grad(torch.nn.functional.cross_entropy(h @ w.t(), t, reduction="sum") * 0.5, (h,))
    assert (gh - rh).abs().max().item() <= REL * rh.abs().max().item()
    trained = w.clone().requires_grad_(True)  # full fine-tuning: the logits recomputed in backward
    with FlopCounterMode(display=False) as full:
        torch.autograd.grad(chunked_cross_entropy_sum(h, trained, None, t, 8), (h, trained))
    # the logits, their recompute and the hidden states' gradient (the weight's, an in-place addmm_,
    # is not counted by FlopCounterMode)
    assert full.get_total_flops() == 3 * one_matmul
    with torch.no_grad(), FlopCounterMode(display=False) as evaluating:  # no backward: no gradient made
        chunked_cross_entropy_sum(h, w, None, t, 8)
    assert evaluating.get_total_flops() == one_matmul
