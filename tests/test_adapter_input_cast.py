"""cockpit.train.adapter_input_cast: no fp32 copy of a LoRA input under autocast, same numbers."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from cockpit.plan.measure import live_tensor_bytes  # noqa: E402
from cockpit.train.adapter_input_cast import skip_cast_under_autocast  # noqa: E402

TINY = dict(
    hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=128, max_position_embeddings=256, tie_word_embeddings=False,
)


def lora_model(dropout: float = 0.0, dora: bool = False):
    """A bf16 Llama with fp32 adapters (PEFT's autocast_adapter_dtype, as the training rank builds it)."""
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).to(torch.bfloat16)
    base.config.use_cache = False
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear", use_dora=dora)
    model = peft.get_peft_model(base, config)
    for p in model.parameters():  # lora_B starts at zero: give the adapters a real path
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    return model


def step(model, ids):
    """Loss, gradients and peak live tensor bytes of one forward/backward under CPU bf16 autocast."""
    mode = live_tensor_bytes()
    with mode:
        mode.track_existing(list(model.parameters()))
        mode.reset_peak()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), grads, mode.peak


def test_same_loss_and_gradients_bit_for_bit_and_less_memory():
    ids = torch.randint(0, TINY["vocab_size"], (2, 96), generator=torch.Generator().manual_seed(1))
    plain = lora_model()
    hooked = copy.deepcopy(plain)
    assert {p.dtype for p in plain.parameters() if p.requires_grad} == {torch.float32}
    assert skip_cast_under_autocast(hooked) == 2 * 7  # every adapted linear of both layers
    loss_a, grads_a, peak_a = step(plain, ids)
    loss_b, grads_b, peak_b = step(hooked, ids)
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.equal(grads_a[name], grads_b[name]), name
    # PEFT's fp32 copies of the adapted inputs, and their saved bf16 copies, are gone
    assert peak_b < peak_a
    hidden, inter, tokens = TINY["hidden_size"], TINY["intermediate_size"], ids.numel()
    # at least one layer's saved bf16 copies: q, k, v, o, gate, up (hidden wide) and down (inter wide)
    assert peak_a - peak_b >= 2 * tokens * (6 * hidden + inter)


def test_outside_autocast_the_cast_still_happens():
    """Generation and evaluation without autocast: bf16 input, fp32 adapters, PEFT must cast."""
    model = lora_model()
    skip_cast_under_autocast(model)
    ids = torch.randint(0, TINY["vocab_size"], (1, 16))
    with torch.no_grad():
        out = model(input_ids=ids).logits  # would raise a dtype mismatch without the cast
    assert out.dtype == torch.bfloat16
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    assert layer.cast_input_dtype_enabled is True


@pytest.mark.parametrize("kind", ["dropout", "dora"])
def test_layers_with_dropout_or_a_variant_keep_the_cast(kind):
    model = lora_model(dropout=0.1) if kind == "dropout" else lora_model(dora=True)
    assert skip_cast_under_autocast(model) == 0
