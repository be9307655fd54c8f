"""One small real measurement: the planner's tensor peak within 15 % of a real training run."""

from __future__ import annotations

import json

import pytest

from cockpit.plan import estimate_config
from cockpit.plan.measure import live_tensor_bytes, measure_training_peak

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

TINY = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 2000,
        "tie_word_embeddings": False, "max_position_embeddings": 512}


def test_tracker_counts_storages_once_and_frees():
    m = live_tensor_bytes()
    with m:
        a = torch.empty(1000)
        b = a.view(10, 100)          # a view: same storage, not counted again
        assert m.live == 4000
        del a
        assert m.live == 4000        # b still holds the storage
        del b
        assert m.live == 0
        assert m.peak == 4000


@pytest.mark.parametrize("ft", ["full", "lora"])
def test_real_training_peak_within_15_percent(tmp_path, ft):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    cfg = {"model_name_or_path": str(tmp_path), "finetuning_type": ft, "cutoff_len": 64,
           "per_device_train_batch_size": 2}
    from cockpit.config.run_config import RunConfig
    from cockpit.config.schema import default_config
    from cockpit.train.model import over_base
    from cockpit.train.trainer import CockpitTrainer

    # the rank's model and trainer (its chunked loss, per-sample attention), which the planner counts
    measured = measure_training_peak(
        str(tmp_path),
        cfg,
        steps=2,
        prepare=over_base(RunConfig.from_mapping({**default_config(), **cfg, "lora_alpha": 16})),
        trainer_class=CockpitTrainer,
    )["peak_bytes"]
    predicted = estimate_config(cfg)[1].tensor_peak
    assert abs(predicted / measured - 1) < 0.15, (predicted, measured)
