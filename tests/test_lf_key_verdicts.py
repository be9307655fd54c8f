"""Issue 37: no LLaMA-Factory key is "unknown". Every field of LLaMA-Factory 0.9.5's argument dataclasses
(and of HF's Seq2SeqTrainingArguments, which its TrainingArguments passes through), as listed by
``bench/lf_key_list.py`` in ``tests/fixtures/llamafactory/lf_keys.json``, either works (a schema key or an
alias, honoured by a stage) or is refused by name with its reason (cockpit/config/parity.py's
REFUSAL_REASONS), never "unknown key (did you mean ...?)". The fixture is read as JSON: no LLaMA-Factory here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import cockpit, tiny_config

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "llamafactory" / "lf_keys.json"
REFUSED = "a LLaMA-Factory key that Cockpit refuses: "


def lf_keys() -> dict[str, dict[str, str]]:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))["keys"]


def problems_for(key: str, value) -> list:
    """The problems ``validate`` names ``key`` in, for a config that sets it (line 7 of lf.yaml)."""
    from cockpit.config import validate
    from cockpit.errors import InputError

    try:
        validate({"dataset": "cockpit_identity", key: value}, file="lf.yaml", lines={key: 7}, check_paths=False)
    except InputError as err:
        return [p for p in err.problems if p.key == key]
    return []


def test_the_fixture_is_llamafactory_0_9_5s_keys():
    data = json.loads(FIXTURE.read_text(encoding="utf-8"))
    keys = data["keys"]
    assert data["llamafactory"] == "0.9.5" and data["transformers"]
    assert list(keys) == sorted(keys)
    origins = {entry["origin"] for entry in keys.values()}
    assert origins == {"llamafactory", "transformers"}
    declared = {entry["declared_in"] for entry in keys.values()}
    for cls in ("BaseModelArguments", "DataArguments", "FinetuningArguments", "LoraArguments", "RLHFArguments",
                "GaloreArguments", "ApolloArguments", "BAdamArgument", "SwanLabArguments", "GeneratingArguments",
                "Seq2SeqTrainingArguments", "TrainingArguments"):
        assert cls in declared, cls
    # LLaMA-Factory's four argument classes alone hold ~215 keys; with HF's training arguments, well over 300
    assert len(keys) > 300
    # every init field of the five classes HfArgumentParser reads a training YAML into (LLaMA-Factory 0.9.5's
    # get_train_args; ModelArguments' compute_dtype / device_map / model_max_length / block_diag_attn are
    # set in __post_init__, never read from a YAML)
    parsed = {cls: sum(e["parsed_by"] == cls for e in keys.values()) for cls in {e["parsed_by"] for e in keys.values()}}
    assert parsed == {"ModelArguments": 76, "DataArguments": 28, "TrainingArguments": 135, "FinetuningArguments": 97,
                      "GeneratingArguments": 10}
    for name in ("pure_bf16", "use_muon", "lora_rank", "vllm_maxlen", "learning_rate", "push_to_hub"):
        assert name in keys


def test_every_llamafactory_key_has_a_verdict():
    from cockpit.config.parity import refusal_reason
    from cockpit.config.schema import ALIASES, LLAMAFACTORY_UNSUPPORTED, SCHEMA
    from cockpit.config.stages import STAGES

    unknown, verdicts = [], {"works": 0, "refused": 0}
    for key in lf_keys():
        if key in SCHEMA or key in ALIASES:
            assert any(caps.honours(ALIASES.get(key, key)) for caps in STAGES.values()), key
            verdicts["works"] += 1
        elif key in LLAMAFACTORY_UNSUPPORTED and refusal_reason(key):
            verdicts["refused"] += 1
        else:
            unknown.append(key)
    assert not unknown, f"{len(unknown)} LLaMA-Factory keys without a verdict: {unknown}"
    assert verdicts["works"] > 100 and verdicts["refused"] > 100, verdicts


@pytest.mark.parametrize("key", sorted(lf_keys()))
def test_no_llamafactory_key_is_an_unknown_key(key):
    """What ``cockpit check`` says of the key itself: a refusal that names it with its reason, or (a key
    that works) nothing about its name; never "unknown key"."""
    from cockpit.config.parity import refusal_reason
    from cockpit.config.schema import LLAMAFACTORY_UNSUPPORTED, SCHEMA

    value = SCHEMA[key].default if key in SCHEMA else True
    found = problems_for(key, value)
    assert not [p for p in found if "unknown key" in p.message], [str(p) for p in found]
    if key in LLAMAFACTORY_UNSUPPORTED:
        why = refusal_reason(key)
        assert why and "unknown" not in why.lower()
        assert [str(p) for p in found] == [f"lf.yaml:7: {key}: {REFUSED}{why}; remove it"]


def test_a_refused_key_exits_2_at_check_naming_key_file_and_line(tmp_path, tiny_model_dir):
    path = tiny_config(tmp_path, tiny_model_dir, use_kt=True)
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("use_kt:"))
    res = cockpit("check", str(path))
    assert res.returncode == 2, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert f"{path}:{line}: use_kt: {REFUSED}KTransformers' AMX MoE backend is not supported" in out
    assert "Intel AMX CPUs" in out and "unknown key" not in out


def test_the_key_table_shows_every_llamafactory_keys_verdict():
    import subprocess
    import sys

    root = FIXTURE.parents[3]
    res = subprocess.run([sys.executable, str(root / "scripts" / "lf_keys_table.py"), "--check"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    table = (root / "docs" / "configuration.md").read_text(encoding="utf-8")
    missing = [k for k in lf_keys() if f"| `{k}` | works" not in table and f"| `{k}` | refused: " not in table]
    assert not missing, missing
