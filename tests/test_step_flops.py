"""One real training step's FLOPs, counted by torch (``FlopCounterMode``), against the figure MFU is made
of (``cockpit.plan.flops``): a LoRA step of CockpitTrainer on the tiny Llama, with and without gradient
checkpointing, does the model's FLOPs (plus the recompute under checkpointing) and no more: no matmul done
twice by mistake (a third head matmul, a forward recomputed without checkpointing, the logits of the
unlabelled positions). Issue 53: the MFU shown is only as true as this count."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

SEQ = 48  # every sample this long, every position after the first labelled: T is one number
SAMPLES = 3


VOCAB = 512  # a small vocabulary: the decoder layers, not the head, hold most FLOPs (as in an 8B model)


def _lora_model():
    """The tiny Llama made ready as a run makes its base ready (``cockpit.train.model.over_base``: per-sample
    SDPA for padding-free rows, then LoRA r8 on every linear layer)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from cockpit.config.load import validate
    from cockpit.train.model import over_base

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, use_cache=False, attn_implementation="sdpa")  # fmt: skip
    torch.manual_seed(0)
    run = validate({"dataset": "x", "finetuning_type": "lora", "lora_rank": 8, "lora_alpha": 16, "lora_target": "all",
                    "packing": True, "per_device_train_batch_size": SAMPLES, "use_cpu": True})  # fmt: skip
    model = over_base(run)(LlamaForCausalLM(cfg))
    model.train()
    return model, run


def cpu_attention_formulas() -> dict:
    """torch counts SDPA's GPU kernels but not the CPU's flash kernel: the same formulas for it (the forward's
    two matmuls; the backward's four and the recompute of the scores)."""
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    def forward(q, k, v, *_, out_shape=None, **__) -> int:
        return sdpa_flop_count(q, k, v)

    def backward(grad_out, q, k, v, *_, out_shape=None, **__) -> int:
        return sdpa_backward_flop_count(grad_out, q, k, v)

    aten = torch.ops.aten
    return {aten._scaled_dot_product_flash_attention_for_cpu: forward,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: backward}  # fmt: skip


def _step_flops(tiny_model_dir, tmp_path, checkpointing: bool) -> tuple[int, object, int]:
    """(FLOPs of one training step, the model, labelled positions) for CockpitTrainer's padding-free batch."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoTokenizer, TrainingArguments

    from cockpit.data.packing import build_collator
    from cockpit.train.arguments import ListDataset
    from cockpit.train.trainer import CockpitTrainer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rng = random.Random(7)
    rows = []
    for _ in range(SAMPLES):
        ids = [rng.randrange(3, VOCAB) for _ in range(SEQ)]
        rows.append({"input_ids": ids, "labels": list(ids)})
    model, run = _lora_model()
    args = TrainingArguments(output_dir=str(tmp_path / f"gc{int(checkpointing)}"), per_device_train_batch_size=SAMPLES,
                             max_steps=1, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no",
                             gradient_checkpointing=checkpointing,
                             gradient_checkpointing_kwargs={"use_reentrant": False} if checkpointing else None)  # fmt: skip
    trainer = CockpitTrainer(model=model, args=args, train_dataset=ListDataset(rows), processing_class=tok,
                             data_collator=build_collator(run, tok, model))  # fmt: skip
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
    labelled = int((batch["labels"][..., 1:] != -100).sum())  # the positions a target is predicted at
    trainer.current_gradient_accumulation_steps = 1  # what the Trainer's loop sets before each step
    with FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas()) as counter:
        trainer.training_step(model, batch)
    assert labelled == SAMPLES * (SEQ - 1)  # each sample's first label is the separator: nothing predicts it
    return counter.get_total_flops(), model, labelled


def _expected(model, labelled: int, checkpointing: bool) -> tuple[float, float]:
    """(model FLOPs of the step, hardware FLOPs) from cockpit.plan.flops, per token times the tokens, less
    what the convention counts and a LoRA step does not do, plus what the attention kernel does beside it:
    the LM head's matmuls (forward and the hidden states' gradient) on the labelled positions only; no
    gradient for the first layer's input through its frozen q, k, v (nothing before it trains), except under
    checkpointing, where the embeddings' output asks for one (transformers' ``enable_input_require_grads``,
    which reentrant checkpoints need, as the Trainer enables them); the flash
    kernel's backward recomputes the attention scores (one more matmul, 2 H Q T a token a layer)."""
    from cockpit.plan.flops import flops_per_token
    from cockpit.plan.params import count_params, dims_of
    from cockpit.train.flops_meter import base_config, trainable_split

    config = base_config(model)
    dims, counts = dims_of(config), count_params(config)
    share, adapter = trainable_split(model)
    per = flops_per_token(dims, counts, SEQ, trainable_share=share, adapter_params=adapter, recompute=checkpointing)
    tokens = SAMPLES * SEQ
    head_unlabelled = 4.0 * dims.vocab * dims.hidden * (tokens - labelled)  # the head is frozen: 2 forward + 2 backward
    first_qkv_input_grad = (
        0.0 if checkpointing else 2.0 * dims.hidden * (dims.heads + 2 * dims.kv_heads) * dims.head_dim * tokens
    )
    scores_recomputed = 2.0 * dims.layers * dims.heads * dims.head_dim * SEQ * tokens
    done = scores_recomputed - head_unlabelled - first_qkv_input_grad
    return per.model * tokens + done, per.hardware * tokens + done


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointing"])
def test_a_lora_step_does_the_model_flops_and_the_recompute_and_no_more(tiny_model_dir, tmp_path, checkpointing):
    counted, model, labelled = _step_flops(tiny_model_dir, tmp_path, checkpointing)
    model_flops, hardware_flops = _expected(model, labelled, checkpointing)
    print(f"checkpointing={checkpointing}: counted {counted:,}  model {model_flops:,.0f}  hardware {hardware_flops:,.0f}  "
          f"counted/hardware {counted / hardware_flops:.4f}")  # fmt: skip
    # within 0.5 % (measured: 0.2 %): the formula's frozen-weight rule (6 N (2 + s) / 3, s over every parameter)
    # gives the adapter's weight gradients a share a little off their exact 2 x adapter; a matmul done twice
    # costs more (the head's forward twice +3.9 % here, one decoder layer's forward twice +11 %, all of them
    # recomputed without checkpointing +43 %; attention over the whole packed row instead of per sample,
    # which this test caught while it was written with a base not made ready as a run makes it, +21 %)
    assert counted == pytest.approx(hardware_flops, rel=0.005)
