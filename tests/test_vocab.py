"""add_tokens / add_special_tokens / new_special_tokens / resize_vocab (issue 18): the tokenizer gains
the tokens, the embeddings and LM head grow (a multiple of 64) with the new rows trained beside the
LoRA adapter, and the run's adapter folder carries both so export / chat load them."""

from __future__ import annotations

import json
import math

import pytest
from conftest import cockpit, tiny_config

BASE_ROWS = 49152  # the tiny model's vocabulary (SmolLM2's tokenizer)


def cfg_for(model_dir, **over):
    from cockpit.config import validate

    return validate({"model_name_or_path": str(model_dir), "dataset": "cockpit_identity", "use_cpu": True,
                     "lora_rank": 4, "lora_alpha": 8, **over})


def test_bad_token_values_are_refused(tiny_model_dir):
    from cockpit.errors import InputError

    for bad, match in (
        ({"add_tokens": "<a>,,<b>"}, "add_tokens.*comma-separated tokens without spaces"),
        ({"add_special_tokens": "<a> <b>"}, "add_special_tokens.*without spaces"),
        ({"add_tokens": "<a>", "add_special_tokens": "<a>"}, "given twice: <a>"),
        ({"add_special_tokens": "<a>", "quantization_bit": 4}, "quantized .*cannot be resized"),
        ({"split_special_tokens": True}, "split_special_tokens.*not supported"),
    ):
        with pytest.raises(InputError, match=match):
            cfg_for(tiny_model_dir, **bad)


def test_new_special_tokens_is_read_as_add_special_tokens(tiny_model_dir):
    cfg = cfg_for(tiny_model_dir, new_special_tokens="<tool>, <eot>")
    assert cfg.add_special_tokens == "<tool>, <eot>"


def test_the_tokenizer_gains_each_token_as_one_id(tiny_model_dir):
    from cockpit.models.resolve import load_tokenizer

    tok = load_tokenizer(cfg_for(tiny_model_dir, add_tokens="<city>", add_special_tokens="<tool>,<eot>"))
    assert len(tok) == BASE_ROWS + 3
    ids = tok("call <tool> in <city> then <eot>", add_special_tokens=False)["input_ids"]
    for token in ("<tool>", "<eot>", "<city>"):
        assert ids.count(tok.convert_tokens_to_ids(token)) == 1 and tok.convert_tokens_to_ids(token) >= BASE_ROWS
    assert tok.decode(ids, skip_special_tokens=True).count("<tool>") == 0  # special: skipped when decoding
    assert "<city>" in tok.decode(ids, skip_special_tokens=True)  # normal: kept


def test_lora_resizes_to_a_multiple_of_64_and_trains_the_new_rows_only(tiny_model_dir):
    import torch

    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import build_model

    cfg = cfg_for(tiny_model_dir, add_special_tokens="<tool>,<eot>")
    model = build_model(cfg, resolve_model(cfg.model_name_or_path, log=lambda *_: None), True, 0)
    emb = model.get_input_embeddings()
    assert emb.weight.shape[0] == 49216 and model.config.vocab_size == 49216  # ceil(49154 / 64) * 64
    extra = {n: p for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n}
    assert list(extra) == ["base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta.default"]
    assert extra[next(iter(extra))].shape == (2, 64)  # the two new tokens' rows
    ids = torch.tensor([[1, 2, BASE_ROWS, BASE_ROWS + 1]])
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and extra[next(iter(extra))].grad.abs().sum() > 0


@pytest.mark.parametrize("template, added", [("llama3", 2), ("gemma", 1), ("qwen", 0)])
def test_a_template_that_adds_stop_words_gets_rows_for_them(tiny_model_dir, template, added):
    """LLaMA-Factory's templates add their stop words as special tokens when the tokenizer lacks them
    (llama3's <|eot_id|> on SmolLM2's tokenizer): the rank then feeds ids past the embeddings
    (IndexError at the first step). They get rows (a multiple of 64), untrained as in LLaMA-Factory."""
    import torch

    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import build_model, tokenizer_as_trained

    cfg = cfg_for(tiny_model_dir, template=template)
    ref = resolve_model(cfg.model_name_or_path, log=lambda *_: None)
    tok = tokenizer_as_trained(cfg, ref)
    assert len(tok) == BASE_ROWS + added
    model = build_model(cfg, ref, True, 0)
    rows = model.get_input_embeddings().weight.shape[0]
    assert rows == (BASE_ROWS if not added else 49216)
    assert not [n for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]  # LoRA only
    ids = torch.tensor([[1, 2, len(tok) - 1]])
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)


def test_freeze_tuning_trains_the_embeddings_when_tokens_are_added(tiny_model_dir):
    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import build_model

    cfg = cfg_for(tiny_model_dir, finetuning_type="freeze", freeze_trainable_layers=1, add_tokens="<city>")
    model = build_model(cfg, resolve_model(cfg.model_name_or_path, log=lambda *_: None), True, 0)
    assert model.get_input_embeddings().weight.shape[0] == 49216 and model.get_input_embeddings().weight.requires_grad


@pytest.mark.slow
def test_a_run_with_new_special_tokens_saves_them_and_exports(tmp_path, tiny_model_dir):
    import torch
    from peft import PeftModel
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cockpit.store.rundir import RunDir
    from cockpit.serve.export import export_run

    cfg = tiny_config(tmp_path, tiny_model_dir, "vocab", add_special_tokens="<tool>,<eot>", max_steps=2, save_steps=10, probes=None)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in (tmp_path / "runs").iterdir() if d.is_dir())
    adapter = run / "adapter"
    tok = AutoTokenizer.from_pretrained(str(adapter))
    for token in ("<tool>", "<eot>"):
        assert len(tok(token, add_special_tokens=False)["input_ids"]) == 1
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    assert shapes["base_model.model.model.embed_tokens.token_adapter.base_layer.weight"] == (49216, 64), shapes
    assert shapes["base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"] == (2, 64)
    # the saved adapter loads on the base grown the same way; a sample with the new tokens has a finite loss
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    base.resize_token_embeddings(len(tok), pad_to_multiple_of=64, mean_resizing=False)
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    ids = torch.tensor([tok("<tool> get_weather(Paris) <eot>", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        assert math.isfinite(model(input_ids=ids, labels=ids).loss.item())
        logits = model(input_ids=ids).logits
    # cockpit export --merge: the merged model has the grown vocabulary and the same outputs
    record = export_run(RunDir(run), merge=True, log=lambda *_: None)
    merged = AutoModelForCausalLM.from_pretrained(record["path"]).eval()
    assert merged.config.vocab_size == 49216
    assert len(AutoTokenizer.from_pretrained(record["path"])) == BASE_ROWS + 2
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=ids).logits, logits, atol=1e-4)
    assert json.loads((run / "summary.json").read_text())["state"] == "finished"
