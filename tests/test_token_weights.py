"""Issue 37: LLaMA-Factory's token-weighted SFT losses, ``use_dft_loss`` (each token's cross-entropy times
its detached probability) and ``use_eaft_loss`` (times ``(top-20 entropy / 3) ** eaft_alpha``), through
the SFT trainer's own ``compute_loss``: with the chunked loss (the default, never the full logits) and
with the model's loss over the full logits (where the chunked loss does not apply), both equal to the
hand-computed weighted loss and not to plain cross-entropy; refused where they have no meaning."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


def cfg_for(model_dir: Path, **over):
    from cockpit.config import validate

    return validate({"model_name_or_path": str(model_dir), "dataset": "cockpit_identity", "use_cpu": True,
                     "template": "chatml", "lora_rank": 4, "lora_alpha": 8, "cutoff_len": 64, "max_steps": 3,
                     "per_device_train_batch_size": 4, "learning_rate": 1e-3, "logging_steps": 1,
                     "save_strategy": "no", **over})


def refused(match: str, **over):
    from cockpit.config import validate
    from cockpit.errors import InputError

    with pytest.raises(InputError, match=match):
        validate({"dataset": "cockpit_identity", **over}, check_paths=False)


def _trainer(tmp_path, tiny_model_dir, **over):
    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model
    from cockpit.train.arguments import training_arguments
    from cockpit.train.model import build_model
    from cockpit.train.recipes.sft import sft_trainer
    from cockpit.train.trainer import CockpitTrainer

    cfg = cfg_for(tiny_model_dir, **over)
    ref = resolve_model(cfg.model_name_or_path, log=lambda *_: None)
    tok = load_tokenizer(cfg, ref, log=lambda *_: None)
    torch.manual_seed(0)
    model = build_model(cfg, ref, True, 0)
    args = training_arguments(cfg, {"checkpoints": tmp_path / "ck"}, True, 1)
    rows = [{"input_ids": r.input_ids, "labels": r.labels} for r in prepare_dataset(cfg, tok).trainable][:8]
    return sft_trainer(CockpitTrainer, cfg, model, args, tok, rows)


def _hand_loss(model, batch, weigh, n_items=None):
    """The weighted loss computed by hand from the model's full logits: per-token cross-entropy of the
    shifted labels, times ``weigh(logits, ce)`` (no gradient), summed over the labelled tokens, divided
    by ``n_items`` or their count."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "position_ids")}
    with torch.no_grad():
        logits = model(**inputs).logits.float()
    labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
    logits, labels = logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)
    keep = labels != -100
    ce = torch.nn.functional.cross_entropy(logits[keep], labels[keep], reduction="none")
    plain = ce.sum() / (n_items or keep.sum())
    return (ce * weigh(logits[keep], ce)).sum().item() / float(n_items or keep.sum()), plain.item()


def _dft(logits, ce):
    return torch.exp(-ce)


def _eaft(alpha):
    def weigh(logits, ce):
        top = torch.topk(logits, 20, dim=-1).values
        p = torch.softmax(top, dim=-1)
        return (-(p * p.log()).sum(-1) / 3.0) ** alpha

    return weigh


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "full-logits"])
@pytest.mark.parametrize(
    ("over", "weigh"),
    [({"use_dft_loss": True}, _dft), ({"use_eaft_loss": True, "eaft_alpha": 0.5}, _eaft(0.5))],
    ids=["dft", "eaft"],
)
def test_the_weighted_loss_is_the_hand_computed_one_and_not_plain_cross_entropy(tmp_path, tiny_model_dir, over,
                                                                               weigh, chunked):
    trainer = _trainer(tmp_path, tiny_model_dir, finetuning_type="full", **over)
    trainer.chunked_loss = chunked
    model = trainer.model
    model.train()
    batch = next(iter(trainer.get_train_dataloader()))
    for n_items in (None, 7):
        want, plain = _hand_loss(model, batch, weigh, n_items)
        got = trainer.compute_loss(model, dict(batch), num_items_in_batch=None if n_items is None else
                                   torch.tensor(n_items))
        assert bool(trainer._chunked_head) is chunked, trainer.chunked_loss_why_not  # the path under test ran
        assert got.item() == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert abs(got.item() - plain) > 1e-3 * plain  # the weights change the loss
    got.backward()  # the gradient flows through the cross-entropy (the weights are constants)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_the_chunked_and_full_logits_weighted_losses_have_the_same_gradients(tiny_model_dir):
    """The weights are constants in both: the chunked backward (softmax - one_hot) x weight equals
    autograd's through the full-logits loss."""
    from transformers import AutoModelForCausalLM

    from cockpit.train.chunked_loss import lm_loss_without_logits, plain_lm_head
    from cockpit.train.token_weights import dft_weights, weighted_causal_lm_loss, weighted_model_loss

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    model.train()
    ids = torch.randint(3, model.config.vocab_size, (2, 24))
    labels = ids.clone()
    labels[:, :10] = -100
    grads = []
    for chunked in (True, False):
        model.zero_grad(set_to_none=True)
        if chunked:
            head, why = plain_lm_head(model)
            assert head is not None, why
            ctx = lm_loss_without_logits(model, head, chunk=7, weighting=dft_weights)
        else:
            ctx = weighted_model_loss(model, weighted_causal_lm_loss(dft_weights))
        with ctx:
            model(input_ids=ids, labels=labels).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, g in grads[0].items():
        ref = grads[1][name]
        assert (g - ref).abs().max().item() <= 1e-5 * ref.abs().max().item(), name


@pytest.mark.slow
def test_a_dft_run_trains_with_the_chunked_loss(tmp_path, tiny_model_dir):
    """Three LoRA steps with use_dft_loss through the SFT trainer: the chunked loss applied, the loss
    finite and the adapter changed."""
    trainer = _trainer(tmp_path, tiny_model_dir, use_dft_loss=True)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    out = trainer.train()
    assert out.global_step == 3 and math.isfinite(out.training_loss)
    assert trainer._chunked_head, trainer.chunked_loss_why_not
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(after[n].detach(), b) for n, b in before.items())


def test_a_forward_that_bypasses_the_loss_function_is_an_error_not_an_unweighted_loss():
    from cockpit.train.token_weights import LossNotCalled, dft_weights, weighted_causal_lm_loss, weighted_model_loss

    class Model:
        loss_function = None

    with pytest.raises(LossNotCalled, match="use_dft_loss"):
        with weighted_model_loss(Model(), weighted_causal_lm_loss(dft_weights)):
            pass


def test_the_weighted_losses_are_refused_where_they_mean_nothing():
    for stage, extra in (("pt", {}), ("dpo", {}), ("kto", {}), ("rm", {}),
                         ("grpo", {"reward_funcs": "exact_match"})):
        refused(f"use_dft_loss: .*{stage}.*DFT / EAFT weigh SFT's token cross-entropy", stage=stage,
                use_dft_loss=True, **extra)
        refused(f"use_eaft_loss: .*{stage}", stage=stage, use_eaft_loss=True, **extra)
    refused("use_eaft_loss: use_dft_loss and use_eaft_loss are two weightings", use_dft_loss=True, use_eaft_loss=True)
    refused("use_dft_loss: use_dft_loss weighs the loss Cockpit computes, and Liger", use_dft_loss=True,
            enable_liger_kernel=True)
    refused("use_asft_loss: .*ASFT adds to DFT a KL term against a reference model", use_asft_loss=True)
    refused("eaft_alpha: the EAFT loss's exponent: applies with use_eaft_loss: true", eaft_alpha=2.0)
    from cockpit.config import validate

    for strategy in ({"zero_stage": 3, "nproc_per_node": 2}, {"fsdp": "full_shard", "nproc_per_node": 2}, {}):
        assert validate({"dataset": "cockpit_identity", "use_dft_loss": True, **strategy},
                        check_paths=False).use_dft_loss is True
