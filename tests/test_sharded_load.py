"""Sharded loading, measured: a random Llama written as safetensors (fp32, about 1 GB) trained for
2 steps on 2 CPU ranks (gloo) under DDP, ZeRO-3 and FSDP2. Every rank reports its peak resident
memory (``rank_memory`` events, VmHWM). ZeRO-3 and FSDP2 never hold the whole model on every
rank, so each rank's peak is below its DDP peak by at least 40 % of the model's size; the
losses match the one-rank run (as tests/test_strategy_runs.py's do).

Size: 1 GB rather than the issue's 2 GB to keep CI time and this shared 24 GiB machine's memory
modest (4 runs); the margin is unambiguous at this size (measured numbers in the README). The
model is narrow and deep (hidden 512, 56 layers) so that its largest tensor, the tied
49152-token embedding, is under a tenth of it: the sharded loaders hold one tensor group in full
at a time. ZeRO-3 runs from a DeepSpeed file whose live-parameter and reuse windows are scaled to
this model (DeepSpeed's default 1e9-parameter windows would keep all 250M parameters gathered).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import read_events
from test_strategy_runs import assert_close, losses, train

pytestmark = pytest.mark.slow
LAYERS, HIDDEN = 56, 512


@pytest.fixture(scope="module")
def big_model_dir(tmp_path_factory, embedded_dir) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = tmp_path_factory.mktemp("llama-1gb")
    tok = AutoTokenizer.from_pretrained(str(embedded_dir))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=True,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def peaks(run: Path) -> dict[int, float]:
    return {e["rank"]: e["vmhwm_mb"] for e in read_events(run) if e["kind"] == "rank_memory" and e["phase"] == "finished"}


def test_sharded_strategies_load_without_a_full_copy_per_rank(tmp_path, big_model_dir):
    model_mb = sum(f.stat().st_size for f in big_model_dir.glob("*.safetensors")) / 2**20
    assert 900 < model_mb < 1200
    over = dict(max_steps=2, cutoff_len=32, probes=None, timeout=600)
    one = train(tmp_path, big_model_dir, "one", per_device_train_batch_size=4, **over)
    ds_file = tmp_path / "ds_z3.json"
    ds_file.write_text(json.dumps({
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto", "zero_allow_untested_optimizer": True, "communication_data_type": "fp32",
        "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True, "reduce_bucket_size": "auto",
                              "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                              "stage3_max_live_parameters": int(2e7), "stage3_max_reuse_distance": 0},
        "steps_per_print": 10**9}))
    runs = {
        "ddp": train(tmp_path, big_model_dir, "ddp", nproc_per_node=2, **over),
        "zero3": train(tmp_path, big_model_dir, "zero3", nproc_per_node=2, deepspeed=str(ds_file), **over),
        "fsdp2": train(tmp_path, big_model_dir, "fsdp2", nproc_per_node=2, fsdp="full_shard auto_wrap", **over),
    }
    measured = {name: peaks(run) for name, run in runs.items()}
    print(json.dumps({"model_mb": round(model_mb), "one_rank": peaks(one), **measured}))  # the README's numbers
    for name in ("zero3", "fsdp2"):
        for rank in (0, 1):
            saved = measured["ddp"][rank] - measured[name][rank]
            assert saved >= 0.4 * model_mb, f"{name} rank {rank}: {measured[name][rank]:.0f} MiB vs DDP {measured['ddp'][rank]:.0f} MiB (saves {saved:.0f} of {model_mb:.0f} MiB)"
    for name, run in runs.items():
        assert_close(losses(run), losses(one), rel=1e-4)
    modes = [line for line in (runs["zero3"] / "logs" / "rank0.log").read_text().splitlines() if "model loaded" in line]
    assert modes == ["[rank0] model loaded (zero3)"]
    rep = json.loads((runs["fsdp2"] / "logs" / "fsdp.rank1.json").read_text())
    assert rep["sharded_load"]["groups"] > 1 and rep["sharded_load"]["adapter_tensors"] > 0
