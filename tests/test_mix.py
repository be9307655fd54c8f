"""mix_strategy / interleave_probs (LLaMA-Factory's dataset mixing): concat, interleave_under (stops
at the shortest dataset), interleave_over (until the longest ends, the others oversampled), with
sampling probabilities; validated by key; the mix is what training renders."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cockpit.config import load_config
from cockpit.data.collect import collect_samples
from cockpit.errors import InputError


def _write(tmp_path, name: str, n: int) -> None:
    rows = [{"instruction": f"say {name}{i}", "output": f"{name}{i}"} for i in range(n)]
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _config(tmp_path, extra: str = ""):
    _write(tmp_path, "a", 3)
    _write(tmp_path, "b", 6)
    (tmp_path / "dataset_info.json").write_text(json.dumps({"a": {"file_name": "a.jsonl"}, "b": {"file_name": "b.jsonl"}}))
    path = tmp_path / "c.yaml"
    path.write_text(f"model_name_or_path: smollm2-135m-instruct\ndataset: a,b\ndataset_dir: {tmp_path}\nseed: 7\n{extra}")
    return load_config(str(path))


def _outputs(cfg) -> list[str]:
    return [s["messages"][-1]["content"] if "messages" in s else s["output"] for s in collect_samples(cfg).samples]


def test_concat_is_the_default_one_dataset_after_the_other(tmp_path):
    assert _outputs(_config(tmp_path)) == ["a0", "a1", "a2", "b0", "b1", "b2", "b3", "b4", "b5"]


def test_interleave_under_alternates_and_stops_at_the_shortest(tmp_path):
    assert _outputs(_config(tmp_path, "mix_strategy: interleave_under\n")) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_interleave_over_runs_until_the_longest_ends_oversampling_the_shorter(tmp_path):
    got = _outputs(_config(tmp_path, "mix_strategy: interleave_over\n"))
    assert got == ["a0", "b0", "a1", "b1", "a2", "b2", "a0", "b3", "a1", "b4", "a2", "b5"]


def test_interleave_probs_weight_the_draws_with_the_seed(tmp_path):
    mostly_b = _outputs(_config(tmp_path, "mix_strategy: interleave_over\ninterleave_probs: 0.1,0.9\n"))
    counts = Counter(o[0] for o in mostly_b)
    assert set(f"b{i}" for i in range(6)) <= set(mostly_b) and set(f"a{i}" for i in range(3)) <= set(mostly_b)
    assert counts["b"] > 2 * counts["a"]  # b drawn far more often, every row of both seen
    again = _outputs(_config(tmp_path, "mix_strategy: interleave_over\ninterleave_probs: 0.1,0.9\n"))
    assert again == mostly_b  # the run's seed fixes the order
    under = _outputs(_config(tmp_path, "mix_strategy: interleave_under\ninterleave_probs: 0.9,0.1\n"))
    assert Counter(o[0] for o in under)["a"] == 3 and under[-1].startswith("a")  # ends when a is used up


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ("interleave_probs: 0.5,0.5\n", "applies to mix_strategy interleave"),
        ("mix_strategy: interleave_under\ninterleave_probs: 0.2,0.3,0.5\n", "3 probabilities for 2 dataset(s)"),
        ("mix_strategy: interleave_over\ninterleave_probs: 0.5,0.6\n", "sum to 1"),
        ("mix_strategy: interleave_over\ninterleave_probs: half,half\n", "comma-separated numbers"),
        ("mix_strategy: shuffle\n", "mix_strategy"),
    ],
)
def test_bad_mix_keys_are_named(tmp_path, extra, said):
    with pytest.raises(InputError) as err:
        _config(tmp_path, extra)
    text = str(err.value)
    assert said in text
    assert ("interleave_probs" if "probs" in extra else "mix_strategy") in text


def test_training_renders_the_mix(tmp_path, tokenizer):
    from cockpit.data.prepare import prepare_dataset

    cfg = _config(tmp_path, "mix_strategy: interleave_over\ntemplate: chatml\n")
    rendered = prepare_dataset(cfg, tokenizer).rendered
    assert len(rendered) == 12  # the oversampled a rows are trained on twice
    texts = [tokenizer.decode(r.input_ids) for r in rendered]
    assert "a0" in texts[0] and "b0" in texts[1] and "a0" in texts[6]
