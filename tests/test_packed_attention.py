"""Per-sample SDPA for padding-free rows (cockpit.train.packed_attention).

The tiny random Llama in fp32: a packed row attended once per sample gives every sample the
loss a padded batch gives it, SDPA runs on each sample's own length (not the row's), training
packed this way equals padded training, the rank's model switches to it only for padding-free
SFT, and a model with a sliding window keeps transformers' masked path (still per sample).
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from cockpit.config.run_config import RunConfig  # noqa: E402
from cockpit.data.packing import build_collator  # noqa: E402
from cockpit.data.padding import PACKED_SDPA  # noqa: E402
from cockpit.train import packed_attention  # noqa: E402
from tests.test_packing import _per_sample_loss, _rows, _train  # noqa: E402


def _model(model_dir, attn: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model.config.use_cache = False
    if attn == PACKED_SDPA:
        assert packed_attention.use_for_padding_free(model)
    return model.eval()


@pytest.fixture
def sdpa_lengths(monkeypatch):
    """The query lengths SDPA is called with."""
    seen: list[int] = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query, *args, **kwargs):
        seen.append(query.shape[-2])
        return real(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


def test_each_packed_sample_gets_its_padded_loss_and_sdpa_runs_per_sample(tiny_model_dir, sdpa_lengths):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = _model(tiny_model_dir, PACKED_SDPA)
    lengths = [7, 19, 12, 30]
    rows = _rows(len(tok), lengths)
    packed = build_collator(RunConfig(packing=True), tok, model)(rows)
    assert packed["cu_seq_lens_q"].tolist() == [0, 7, 26, 38, 68]  # the samples' bounds reach attention
    with torch.no_grad():
        want = _per_sample_loss(model, build_collator(RunConfig(packing=False), tok)(rows))
        sdpa_lengths.clear()
        got = _per_sample_loss(model, packed)
    assert got == pytest.approx(want, abs=1e-4)
    layers = model.config.num_hidden_layers
    assert sdpa_lengths == lengths * layers  # each sample alone, never the 68-token row


def test_stock_sdpa_attends_over_the_whole_packed_row(tiny_model_dir, sdpa_lengths):
    """The control: transformers' own SDPA path computes the packed row in one masked call."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = _model(tiny_model_dir, "sdpa")
    packed = build_collator(RunConfig(packing=True), tok, model)(_rows(len(tok), [7, 19, 12, 30]))
    assert "cu_seq_lens_q" not in packed
    with torch.no_grad():
        model(**{k: v for k, v in packed.items() if k != "labels"})
    assert set(sdpa_lengths) == {68}


def test_packed_sdpa_training_equals_padded_training(tiny_model_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    rows = _rows(len(tok), [9, 31, 14, 22, 40, 11, 27, 18, 35, 8, 16, 25], seed=3)
    padded, _, _ = _train(tiny_model_dir, tok, rows, {"packing": False}, tmp_path / "a")
    packed, model, _ = _train(tiny_model_dir, tok, rows, {"packing": True}, tmp_path / "b", attn=PACKED_SDPA)
    assert model.config._attn_implementation == PACKED_SDPA
    assert len(packed) == 4
    assert packed == pytest.approx(padded, abs=1e-4)


@pytest.mark.parametrize(
    ("cfg", "want"),
    [
        ({"packing": True}, PACKED_SDPA),
        ({"packing": False}, "sdpa"),
        ({"packing": True, "flash_attn": "eager"}, "eager"),
        ({"packing": True, "stage": "dpo"}, "sdpa"),
    ],
)
def test_the_rank_attends_per_sample_only_for_padding_free_sft(tiny_model_dir, cfg, want):
    from cockpit.config.run_config import RunConfig
    from cockpit.models.resolve import ModelRef
    from cockpit.train.model import build_model

    full = RunConfig(dataset="x", finetuning_type="full", per_device_train_batch_size=2, **cfg)
    model = build_model(full, ModelRef(str(tiny_model_dir)), use_cpu=True, local_rank=0)
    assert model.config._attn_implementation == want


def test_a_saved_model_does_not_name_the_cockpit_kernel(tiny_model_dir, tmp_path):
    """A fully fine-tuned model's config.json loads anywhere (vLLM, another transformers)."""
    model = _model(tiny_model_dir, PACKED_SDPA)
    model.save_pretrained(tmp_path / "out")
    assert PACKED_SDPA not in (tmp_path / "out" / "config.json").read_text()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "llama"


def test_a_sliding_window_model_keeps_the_masked_path(embedded_dir, sdpa_lengths):
    """Qwen2 with a 4-token window: per-sample SDPA would ignore the window, so the row goes
    through transformers' masked SDPA (window and sample bounds in one mask), and each sample
    still gets its padded loss."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(embedded_dir))
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                      max_window_layers=0, layer_types=["sliding_attention"] * 2, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).eval()
    model.config.use_cache = False
    assert packed_attention.use_for_padding_free(model)
    rows = _rows(len(tok), [7, 19, 12])
    with torch.no_grad():
        want = _per_sample_loss(model, build_collator(RunConfig(packing=False), tok)(rows))
        sdpa_lengths.clear()
        got = _per_sample_loss(model, build_collator(RunConfig(packing=True), tok, model)(rows))
    assert got == pytest.approx(want, abs=1e-4)
    assert set(sdpa_lengths) == {38}  # the masked path: one call over the row
