"""Stage rm's value model is built by the same builder as every other stage's model
(:func:`cockpit.train.model.build_model` with ``value_head=True``), so the model keys LLaMA-Factory
applies to its reward stage apply here too: a trained adapter loaded (a value model's) or merged
(``create_new_adapter``), ``upcast_layernorm`` / ``upcast_lmhead_output``, ``use_llama_pro`` (issue 30 §1).
QLoRA's value model is tested with bitsandbytes in tests/test_qlora.py."""

from __future__ import annotations

import pytest

from test_vocab import cfg_for


def value_model(model_dir, **over):
    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import build_model

    cfg = cfg_for(model_dir, stage="rm", dataset="cockpit_identity_pairs", **over)
    return build_model(cfg, resolve_model(cfg.model_name_or_path, log=lambda *_: None), True, 0, value_head=True)


def test_a_new_value_model_trains_its_adapter_and_its_head(tiny_model_dir):
    model = value_model(tiny_model_dir)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert any(".score." in n for n in trainable) and any("lora_" in n for n in trainable)
    assert model.peft_config["default"].task_type == "SEQ_CLS"
    assert model.get_base_model().score.out_features == 1


def test_upcasts_apply_to_the_value_model(tiny_model_dir):
    import torch

    model = value_model(tiny_model_dir, bf16=True, upcast_layernorm=True, upcast_lmhead_output=True)
    norms = {p.dtype for n, p in model.named_parameters() if p.ndim == 1 and "norm" in n}
    assert norms == {torch.float32}
    plain = value_model(tiny_model_dir, bf16=True)
    assert {p.dtype for n, p in plain.named_parameters() if p.ndim == 1 and "norm" in n} == {torch.bfloat16}
    ids = torch.tensor([[1, 2, 3]])
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the Trainer runs a bf16 step
        assert model(input_ids=ids).logits.dtype == torch.float32  # the head's scores, upcast
        assert plain(input_ids=ids).logits.dtype == torch.bfloat16


def test_a_value_models_adapter_trains_further_and_a_causal_one_is_merged_or_refused(tiny_model_dir, tmp_path):
    import torch

    from cockpit.errors import InputError

    first = value_model(tiny_model_dir)
    with torch.no_grad():
        first.get_base_model().score.modules_to_save["default"].weight.fill_(0.25)
    first.save_pretrained(tmp_path / "rm-adapter")
    again = value_model(tiny_model_dir, adapter_name_or_path=str(tmp_path / "rm-adapter"))
    head = again.get_base_model().score.modules_to_save["default"].weight
    assert head.requires_grad and torch.all(head == 0.25)  # the trained head came back, and trains on

    sft = cfg_for(tiny_model_dir)  # an SFT (causal LM) adapter: no value head in it
    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import build_model

    causal = build_model(sft, resolve_model(sft.model_name_or_path, log=lambda *_: None), True, 0)
    causal.save_pretrained(tmp_path / "sft-adapter")
    with pytest.raises(InputError, match="adapter_name_or_path.*create_new_adapter"):
        value_model(tiny_model_dir, adapter_name_or_path=str(tmp_path / "sft-adapter"))
    merged = value_model(tiny_model_dir, adapter_name_or_path=str(tmp_path / "sft-adapter"), create_new_adapter=True)
    assert merged.peft_config["default"].task_type == "SEQ_CLS"
    assert any(".score." in n for n, p in merged.named_parameters() if p.requires_grad)


def test_llama_pro_targets_only_the_expanded_layers_of_the_value_model(tiny_model_dir):
    model = value_model(tiny_model_dir, use_llama_pro=True, freeze_trainable_layers=1)
    layers = {int(n.split(".layers.")[1].split(".")[0]) for n, p in model.named_parameters() if p.requires_grad and "lora_" in n}
    assert len(layers) == 1


def test_check_accepts_the_model_keys_for_stage_rm(tiny_model_dir, tmp_path):
    from cockpit.config import validate

    value_model(tiny_model_dir).save_pretrained(tmp_path / "rm-adapter")
    for key, value in (("upcast_layernorm", True), ("upcast_lmhead_output", True), ("quantization_bit", 4),
                       ("adapter_name_or_path", str(tmp_path / "rm-adapter")), ("use_llama_pro", True)):
        cfg = validate({"model_name_or_path": str(tiny_model_dir), "stage": "rm", "dataset": "cockpit_identity_pairs",
                        "use_cpu": True, key: value, **({"create_new_adapter": True} if key == "adapter_name_or_path" else {})})
        assert getattr(cfg, key) == value
