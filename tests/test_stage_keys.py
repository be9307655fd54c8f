"""Issue 30 section 1: what each stage honours. A key a non-SFT stage accepts in the schema but does
not honour is refused at ``cockpit check`` (exit 2, naming the key and the stage; no run dir);
``do_eval: false`` means no evaluation in every stage; ``cockpit check`` and the ranks keep the same
samples at cutoff_len (one rule, ``survives_cutoff`` / ``Prepared.trainable``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cockpit, read_events, tiny_config

from cockpit.config.load import load_config, validate
from cockpit.config.schema import SCHEMA
from cockpit.config.stages import HONOURED_VALUES, UNHONOURED
from cockpit.errors import InputError

FIXTURES = Path(__file__).parent / "fixtures" / "llamafactory"
STAGE_KEYS = [(stage, key) for stage, keys in UNHONOURED.items() for key in keys]
# keys a stage needs before any other rule passes (grpo: its reward functions, a batch of whole groups)
STAGE_NEEDS = {"grpo": {"reward_funcs": "exact_match", "num_generations": 2, "per_device_train_batch_size": 2}}


def other_value(key: str):
    """A value of ``key`` other than its default (and other than a value the stage honours anyway)."""
    spec = SCHEMA[key]
    if spec.type == "bool":
        return not spec.default  # freeze_vision_tower's default is true
    if spec.choices:
        return next(c for c in spec.choices if c != spec.default and c not in HONOURED_VALUES.get(key, ()))
    if spec.type == "int":
        return 5
    if spec.type == "float":
        if spec.default == 0:  # 0.0 times ten is still the default: half the range instead
            return (spec.max or 1.0) / 2
        return 16.0 if spec.default is None else spec.default * 10
    return {"interleave_probs": "0.5,0.5", "metric_for_best_model": "loss"}.get(key, "other")


def pair_file(path: Path, n: int = 6, prompt_words: int = 3) -> Path:
    rows = [
        {
            "instruction": f"Question {i}: " + " ".join(["why"] * prompt_words * (1 + i % 3)),
            "chosen": f"A good answer number {i}, " + "kind words " * (i % 4),
            "rejected": f"A poor answer number {i}.",
        }
        for i in range(n)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_every_stage_key_pair_has_a_reason_and_sft_refuses_none():
    assert not UNHONOURED["sft"] and set(UNHONOURED) == set(SCHEMA["stage"].choices)
    for stage, key in STAGE_KEYS:
        assert key in SCHEMA and UNHONOURED[stage][key], (stage, key)


@pytest.mark.parametrize("stage, key", STAGE_KEYS)
def test_validate_refuses_a_key_the_stage_does_not_honour(stage, key):
    raw = {"dataset": "x.json", "stage": stage, **STAGE_NEEDS.get(stage, {}), key: other_value(key)}
    with pytest.raises(InputError) as err:
        validate(raw, check_paths=False)
    mine = [p for p in err.value.problems if p.key == key and f"not honoured for stage {stage}" in p.message]
    assert mine, [str(p) for p in err.value.problems]
    assert "remove it or use stage sft" in mine[0].message
    # the default (or the value the stage honours anyway) passes that rule
    quiet = {"dataset": "x.json", "stage": stage, **STAGE_NEEDS.get(stage, {}), key: HONOURED_VALUES.get(key, (SCHEMA[key].default,))[0]}
    if quiet[key] is not None:
        validate(quiet, check_paths=False)
    try:  # stage sft honours every one of them (other rules may still ask for more keys)
        validate({**raw, "stage": "sft"}, check_paths=False)
    except InputError as sft_err:
        assert not [p for p in sft_err.problems if "not honoured" in p.message]


@pytest.mark.parametrize("stage", [stage for stage in ("pt", "dpo", "kto", "rm") if UNHONOURED[stage]])
def test_cockpit_check_exits_2_naming_each_key_and_the_stage(stage, tmp_path, tiny_model_dir):
    keys = {key: other_value(key) for key in UNHONOURED[stage]}
    if "adapter_name_or_path" in keys:
        keys["adapter_name_or_path"] = str(tmp_path)  # exists: only the stage's refusal is left for it
    data = pair_file(tmp_path / "pairs.jsonl")
    cfg = tiny_config(tmp_path, tiny_model_dir, stage, stage=stage, dataset=str(data), probes=None, **keys)
    res = cockpit("check", str(cfg), "--set", "use_cpu=true")
    assert res.returncode == 2, res.stdout + res.stderr
    out = res.stdout + res.stderr
    for key in keys:
        assert f"{key}: not honoured for stage {stage} yet" in out, (key, out[-3000:])


def test_cockpit_train_refuses_before_any_run_dir(tmp_path, tiny_model_dir):
    data = pair_file(tmp_path / "pairs.jsonl")
    cfg = tiny_config(
        tmp_path, tiny_model_dir, "dpo", stage="dpo", dataset=str(data), probes=None, group_by_length=True
    )
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "group_by_length: not honoured for stage dpo yet" in res.stdout + res.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# -- evaluation, mixing and LoRA+ in every stage ----------------------------------------------------
EVAL_KEYS = {
    "val_size": 2,
    "eval_strategy": "steps",
    "eval_steps": 1,
    "save_steps": 1,
    "load_best_model_at_end": True,
    "metric_for_best_model": "eval_loss",
    "greater_is_better": False,
    "eval_on_start": True,
}


def text_file(path: Path, n: int, word: str) -> Path:
    path.write_text("".join(json.dumps({"text": f"{word} {i}: " + "the kestrel hovers " * 4}) + "\n" for i in range(n)))
    return path


@pytest.mark.parametrize("stage", ["pt", "dpo", "kto", "rm"])
def test_stage_trainers_take_loraplus_and_the_eval_schedule(stage, tmp_path, tiny_model_dir):
    from transformers import TrainingArguments

    from cockpit.train.recipes import get_recipe
    from cockpit.train.recipes.base import stage_arguments

    if stage == "pt":
        data = {"dataset": str(text_file(tmp_path / "t.jsonl", 12, "Doc")), "cutoff_len": 16}
    elif stage == "kto":
        rows = [{"instruction": f"Q{i}", "output": f"Answer {i}", "kto_tag": i % 2 == 0} for i in range(8)]
        (tmp_path / "kto.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        info = {
            "k": {
                "file_name": "kto.jsonl",
                "formatting": "alpaca",
                "columns": {"prompt": "instruction", "response": "output", "kto_tag": "kto_tag"},
            }
        }
        (tmp_path / "dataset_info.json").write_text(json.dumps(info))
        data = {"dataset": "k", "dataset_dir": str(tmp_path)}
    else:
        data = {"dataset": str(pair_file(tmp_path / "pairs.jsonl", n=8))}
    keys = {**EVAL_KEYS, "loraplus_lr_ratio": 16.0, "learning_rate": 1e-4}
    cfg = load_config(
        tiny_config(tmp_path, tiny_model_dir, stage, stage=stage, probes=None, use_cpu=True, **data, **keys)
    )
    recipe = get_recipe(stage)
    ctx = _ctx(cfg, tiny_model_dir, tmp_path)
    data_ = recipe.build_data(ctx)
    assert len(data_.held_out) == 2
    model, ref = recipe.build_models(ctx)
    trainer = recipe.build_trainer(ctx, model, ref, data_, [])
    args = trainer.args
    assert (args.eval_strategy, args.eval_steps, args.eval_on_start) == ("steps", 1, True)
    assert args.load_best_model_at_end and args.metric_for_best_model == "eval_loss" and args.greater_is_better is False
    names = {id(p): n for n, p in trainer.model.named_parameters()}
    lrs = {g["lr"] for g in trainer.optimizer.param_groups if any("lora_B" in names[id(p)] for p in g["params"])}
    assert len(lrs) == 1 and lrs.pop() == pytest.approx(1.6e-3), lrs  # LoRA+: the B matrices at 16 x the learning rate
    off = load_config(
        tiny_config(
            tmp_path,
            tiny_model_dir,
            f"{stage}-off",
            stage=stage,
            probes=None,
            use_cpu=True,
            **data,
            val_size=2,
            do_eval=False,
        )
    )
    ctx = _ctx(off, tiny_model_dir, tmp_path)
    assert stage_arguments(TrainingArguments, ctx, recipe.build_data(ctx)).eval_strategy == "no"


@pytest.mark.parametrize("stage", ["pt", "dpo"])
def test_stage_eval_dataset_is_read_like_the_dataset(stage, tmp_path, tiny_model_dir):
    from cockpit.train.recipes import get_recipe

    if stage == "pt":
        train, held = text_file(tmp_path / "train.jsonl", 12, "Doc"), text_file(tmp_path / "eval.jsonl", 4, "Held")
    else:
        train, held = pair_file(tmp_path / "train.jsonl", n=8), pair_file(tmp_path / "eval.jsonl", n=3)
    cfg = load_config(
        tiny_config(
            tmp_path,
            tiny_model_dir,
            stage,
            stage=stage,
            probes=None,
            use_cpu=True,
            dataset=str(train),
            eval_dataset=str(held),
            cutoff_len=32,
        )
    )
    data_ = get_recipe(stage).build_data(_ctx(cfg, tiny_model_dir, tmp_path))
    if stage == "pt":
        from cockpit.data.stage_data import prepare_stage_data

        assert (
            data_.held_out
            and [r["input_ids"] for r in data_.held_out]
            == prepare_stage_data(cfg.replace(dataset=str(held)), _ctx(cfg, tiny_model_dir, tmp_path).tokenizer).blocks
        )
    else:
        assert len(data_.held_out) == 3 and len(data_.train) == 8
        assert {r["prompt"][0]["content"] for r in data_.held_out} <= {
            json.loads(l)["instruction"] for l in held.read_text().splitlines()
        }


def test_stage_datasets_mix_by_mix_strategy(tmp_path):
    from cockpit.config.run_config import RunConfig
    from cockpit.data.collect import mixed_order
    from cockpit.data.stage_data import collect_stage_samples

    a, b = pair_file(tmp_path / "a.jsonl", n=6), pair_file(tmp_path / "b.jsonl", n=2, prompt_words=9)
    columns = {"prompt": "instruction", "chosen": "chosen", "rejected": "rejected"}
    info = {n: {"file_name": f"{n}.jsonl", "ranking": True, "columns": columns} for n in ("a", "b")}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    base = RunConfig(stage="dpo", dataset="a,b", dataset_dir=str(tmp_path), seed=3)
    concat = collect_stage_samples(base).samples
    mixed = collect_stage_samples(base.replace(mix_strategy="interleave_under")).samples
    assert len(concat) == 8 and len(mixed) == 4  # alternating until the shorter file ends
    order = mixed_order([6, 2], "interleave_under", None, 3)
    assert mixed == [concat[j if k == 0 else 6 + j] for k, j in order]
    over = collect_stage_samples(base.replace(mix_strategy="interleave_over")).samples
    assert len(over) == 12  # alternating, the shorter file repeated until the longer one is used up


@pytest.mark.slow
def test_dpo_run_evaluates_during_training_and_keeps_the_best_model(tmp_path, tiny_model_dir):
    data, held = pair_file(tmp_path / "pairs.jsonl", n=8), pair_file(tmp_path / "held.jsonl", n=3)
    keys = {k: v for k, v in EVAL_KEYS.items() if k != "val_size"}
    cfg = tiny_config(
        tmp_path,
        tiny_model_dir,
        "dpo",
        stage="dpo",
        dataset=str(data),
        eval_dataset=str(held),
        probes=None,
        max_steps=3,
        **keys,
    )
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    evals = [e for e in read_events(run) if e["kind"] == "eval"]
    assert [e["step"] for e in evals][:4] == [0, 1, 2, 3], evals  # eval_on_start, then every step; then the final one
    assert all("eval_loss" in e or "loss" in e for e in evals)
    states = sorted((run / "checkpoints").glob("checkpoint-*/trainer_state.json"))
    best = json.loads(states[-1].read_text())["best_model_checkpoint"]
    assert best and "checkpoint-" in best


# -- do_eval: false ---------------------------------------------------------------------------
@pytest.mark.parametrize("stage", ["sft", "pt", "dpo", "kto", "rm"])
def test_do_eval_false_turns_evaluation_off(stage):
    from cockpit.config.parity import evaluates
    from cockpit.train.variants import training_kwargs

    on = validate({"dataset": "x.json", "stage": stage, "val_size": 0.2, **STAGE_NEEDS.get(stage, {})}, check_paths=False)
    assert evaluates(on.mapping()) and on.do_eval is None
    off = validate({"dataset": "x.json", "stage": stage, "val_size": 0.2, "do_eval": False, **STAGE_NEEDS.get(stage, {})},
                   check_paths=False)
    assert not evaluates(off.mapping()) and off.eval_strategy == "no"
    assert training_kwargs(off)["eval_strategy"] == "no" and not training_kwargs(off)["eval_on_start"]
    resolved = off.keys_only()
    assert validate(resolved, check_paths=False).eval_strategy == "no"  # the resolved config reads the same
    resolved_on = on.keys_only()
    assert evaluates(validate(resolved_on, check_paths=False).mapping())  # and a default one still evaluates (resume --set)
    if stage == "sft":
        assert training_kwargs(on)["eval_strategy"] == "steps"


@pytest.mark.parametrize(
    "keys, named",
    [
        ({"eval_strategy": "steps"}, "eval_strategy"),
        ({"eval_on_start": True}, "eval_on_start"),
        ({"eval_steps": 3}, "eval_steps"),
        ({"load_best_model_at_end": True}, "load_best_model_at_end"),
    ],
)
def test_do_eval_false_with_a_key_that_evaluates_is_refused(keys, named):
    with pytest.raises(InputError) as err:
        validate({"dataset": "x.json", "val_size": 0.2, "do_eval": False, **keys}, check_paths=False)
    assert any(p.key == named and "do_eval is false" in p.message for p in err.value.problems), err.value


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "dpo"])
@pytest.mark.parametrize("do_eval", [None, False])
def test_do_eval_false_run_records_no_evaluation(stage, do_eval, tmp_path, tiny_model_dir):
    over = {"stage": stage, "probes": None, "max_steps": 2, "save_steps": 10, "val_size": 2}
    if do_eval is not None:
        over["do_eval"] = do_eval
    if stage == "dpo":
        over["dataset"] = str(pair_file(tmp_path / "pairs.jsonl", n=8))
    cfg = tiny_config(tmp_path, tiny_model_dir, stage, **over)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    kinds = {e["kind"] for e in read_events(run)}
    assert "run_finished" in kinds, kinds
    if do_eval is None:  # unset: the held-out split is evaluated
        assert "eval" in kinds and (stage == "sft" or "held_out" in kinds), kinds
    else:
        assert not kinds & {"eval", "held_out"}, kinds


# -- one cutoff rule for check and the ranks ------------------------------------------------------
def test_llamafactory_reward_example_at_cutoff_128_is_refused_at_check(tmp_path, monkeypatch, tiny_model_dir):
    """LLaMA-Factory's reward example with cutoff_len 128 and max_samples 16 on pairs like its demo data
    (long prompts and answers): 7 prompts fill the cutoff, the other 9 pairs are longer than it on a side.
    The check used to leave 9 pairs and the rank none (num_samples=0); now the check says so, exit 2."""
    monkeypatch.chdir(tmp_path)
    rows = [
        {
            "instruction": "Explain this. " + "context words " * (70 if i < 7 else 45),
            "chosen": "A careful answer " + "with detail " * 20,
            "rejected": "A short answer " + "without care " * 15,
        }
        for i in range(20)
    ]
    data = tmp_path / "long_pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    over = {
        "model_name_or_path": str(tiny_model_dir),
        "cutoff_len": 128,
        "max_samples": 16,
        "bf16": False,
        "dataset": str(data),
    }
    res = cockpit(
        "check",
        str(FIXTURES / "qwen3_lora_reward.yaml"),
        *[f"--set={k}={v}" for k, v in over.items()],
        cwd=str(tmp_path),
    )
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    out = res.stdout + res.stderr
    assert "cutoff_len" in out and "cutoff_len 128" in out and "nothing is left to train on" in out, out[-2000:]
    assert not (tmp_path / "saves").exists()


def _ctx(cfg, tiny_model_dir, tmp_path):
    from cockpit.models.resolve import load_tokenizer, resolve_model
    from cockpit.train.recipes.base import RecipeContext

    ref = resolve_model(str(tiny_model_dir))
    tok = load_tokenizer(cfg, ref)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    dirs = {"checkpoints": tmp_path / "ck", "out": tmp_path, "adapter": tmp_path / "a", "plot": tmp_path / "p.png"}
    return RecipeContext(None, cfg, 0, 1, 0, None, 0.0, True, dirs, ref, tok, lambda *_: None)


@pytest.mark.parametrize("stage, cutoff", [("dpo", 32), ("rm", 40), ("kto", 18)])
def test_check_and_rank_keep_the_same_pairs(stage, cutoff, tmp_path, tiny_model_dir):
    """What ``cockpit check`` counts, the rank's data and TRL's tokenised train set hold the same
    number of samples: some dropped at cutoff_len, none more by TRL."""
    from cockpit.preflight.checks import check_run
    from cockpit.train.recipes import get_recipe

    if stage == "kto":
        rows = [
            {
                "instruction": f"Q{i} " + "why " * (3 * (i % 4)),
                "output": f"Answer {i} " + "ok " * i,
                "kto_tag": i % 2 == 0,
            }
            for i in range(10)
        ]
        data = tmp_path / "kto.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        info = {
            "k": {
                "file_name": str(data),
                "formatting": "alpaca",
                "columns": {"prompt": "instruction", "response": "output", "kto_tag": "kto_tag"},
            }
        }
        (tmp_path / "dataset_info.json").write_text(json.dumps(info))
        extra = {"dataset": "k", "dataset_dir": str(tmp_path)}
    else:
        extra = {"dataset": str(pair_file(tmp_path / "pairs.jsonl", n=10, prompt_words=8))}
    path = tiny_config(
        tmp_path, tiny_model_dir, stage, stage=stage, cutoff_len=cutoff, probes=None, use_cpu=True, **extra
    )
    cfg = load_config(path)
    checked = check_run(cfg, log=lambda *_: None, with_devices=False)
    assert 0 < checked.samples < 10, checked.report.lines()  # the cutoff drops some, not all
    assert checked.report.samples - checked.report.emptied == checked.samples
    recipe = get_recipe(stage)
    ctx = _ctx(cfg, tiny_model_dir, tmp_path)
    data_ = recipe.build_data(ctx)
    assert len(data_.train) + len(data_.held_out) == checked.samples
    if stage == "rm":  # the reward trainer's rule drops more than "the prompt fills cutoff_len" (the old check's)
        # (the tokenizer now renders with the config's template: build_data chose it)
        from cockpit.data.stage_data import answer_lengths, collect_stage_samples

        prompts = [
            answer_lengths(ctx.tokenizer, s["prompt"], [s["chosen"]])[0] for s in collect_stage_samples(cfg).samples
        ]
        assert sum(p < cutoff for p in prompts) > checked.samples
    model, ref = recipe.build_models(ctx)
    trainer = recipe.build_trainer(ctx, model, ref, data_, [])
    assert len(trainer.train_dataset) == checked.samples  # TRL's own filter drops nothing more


def test_sft_check_counts_the_rows_the_rank_trains(tmp_path, tiny_model_dir):
    from cockpit.preflight.checks import check_run
    from cockpit.train.recipes import get_recipe

    rows = [
        {"instruction": f"Question {i}: " + "tell me more " * (10 * (i % 3)), "output": f"Answer {i}."}
        for i in range(9)
    ]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    cfg = load_config(
        tiny_config(tmp_path, tiny_model_dir, "sft", dataset=str(data), cutoff_len=48, probes=None, use_cpu=True)
    )
    checked = check_run(cfg, log=lambda *_: None, with_devices=False)
    # (whether any sample loses every answer token depends on how rendering truncates: the counts agree either way)
    assert 0 < checked.samples <= 9 and checked.report.emptied == 9 - checked.samples
    rank = get_recipe("sft").build_data(_ctx(cfg, tiny_model_dir, tmp_path))
    assert len(rank.train) + len(rank.held_out) == checked.samples


def test_pt_tokenises_in_preprocessing_num_workers_processes(tokenizer):
    from cockpit.data.stage_data import encode_texts, pack_texts

    texts = [f"Document {i}: kestrels hover over the grass." for i in range(8)]
    assert encode_texts(tokenizer, texts, 2) == encode_texts(tokenizer, texts, 1)
    assert pack_texts(tokenizer, texts, 16, workers=2) == pack_texts(tokenizer, texts, 16)


# -- stage rm: the LoRA variants and model-loading keys reach the value model ----------------------
def test_rm_value_model_takes_lora_variants_and_attention(tmp_path, tiny_model_dir):
    from cockpit.train.recipes.reward import build_value_model

    keys = {"use_dora": True, "use_rslora": True, "additional_target": "embed_tokens", "flash_attn": "eager"}
    cfg = validate(
        {"model_name_or_path": str(tiny_model_dir), "dataset": "x.json", "stage": "rm", "use_cpu": True, **keys},
        check_paths=False,
    )
    model = build_value_model(_ctx(cfg, tiny_model_dir, tmp_path))
    lcfg = model.peft_config["default"]
    assert (
        lcfg.use_dora and lcfg.use_rslora and "embed_tokens" in lcfg.modules_to_save and "score" in lcfg.modules_to_save
    )
    assert any("lora_magnitude_vector" in n for n, _ in model.named_parameters())  # DoRA's magnitudes
    assert model.config._attn_implementation == "eager"
    plain = build_value_model(
        _ctx(
            validate(
                {**cfg.keys_only(), "use_dora": False, "flash_attn": "auto"},
                check_paths=False,
            ),
            tiny_model_dir,
            tmp_path,
        )
    )
    assert not any("lora_magnitude_vector" in n for n, _ in plain.named_parameters())
    pissa = validate(
        {**cfg.keys_only(), "pissa_init": True, "use_dora": False},
        check_paths=False,
    )
    assert str(
        build_value_model(_ctx(pissa, tiny_model_dir, tmp_path)).peft_config["default"].init_lora_weights
    ).startswith("pissa")


# -- declared capabilities (issue 30, section 2) ------------------------------------------------------
def test_every_recipe_reads_the_capabilities_its_stage_declares():
    from cockpit.config.stages import STAGES
    from cockpit.train.recipes import RECIPES, get_recipe

    assert list(STAGES) == list(SCHEMA["stage"].choices) and set(RECIPES) == set(STAGES)
    for stage, caps in STAGES.items():
        recipe = get_recipe(stage)
        assert recipe.stage == stage and recipe.capabilities is caps


@pytest.mark.parametrize(
    ("stage", "key", "value"), [("dpo", "fsdp", "full_shard"), ("kto", "zero_stage", 3), ("pt", "deepspeed", "ds.json")]
)
def test_a_stage_refuses_a_strategy_it_does_not_run_under_naming_key_and_stage(stage, key, value):
    raw = {"dataset": "x.json", "stage": stage, "nproc_per_node": 2, key: value}
    if stage == "kto":
        raw["pref_loss"] = "sigmoid"
    with pytest.raises(InputError) as err:
        validate(raw, check_paths=False)
    found = [p for p in err.value.problems if p.key == key]
    assert found and f"stage {stage}" in found[0].message and "runs under ddp" in found[0].message
    validate({**raw, "stage": "sft"}, check_paths=False)  # SFT runs under it


def test_the_ranks_refuse_a_key_the_stage_does_not_honour_when_no_check_ran():
    """An older run dir's config.yaml reaches the ranks without `cockpit check`: the recipe refuses it."""
    from cockpit.config.run_config import RunConfig
    from cockpit.train.recipes import get_recipe

    cfg = RunConfig.from_resolved({"dataset": "x.json", "stage": "dpo", "group_by_length": True})
    with pytest.raises(InputError) as err:
        get_recipe("dpo").refuse_what_it_does_not_honour(cfg)
    assert err.value.problems[0].key == "group_by_length" and "stage dpo" in str(err.value)
    get_recipe("sft").refuse_what_it_does_not_honour(cfg.replace(stage="sft"))


def test_the_key_tables_stage_columns_are_the_declarations():
    from cockpit.config.stages import STAGES

    table = (Path(__file__).resolve().parent.parent / "docs" / "configuration.md").read_text(encoding="utf-8")
    header = next(line for line in table.splitlines() if line.startswith("| key | Cockpit |"))
    assert header.split("|")[3:-1] == [f" {s} " for s in STAGES]
    for key in ("fsdp", "group_by_length", "adapter_name_or_path", "learning_rate"):
        row = next(line for line in table.splitlines() if line.startswith(f"| `{key}` |"))
        cells = [c.strip() for c in row.split("|")[-len(STAGES) - 1 : -1]]
        assert cells == ["yes" if caps.honours(key) else "**no**" for caps in STAGES.values()], key


def test_pissa_convert_works_in_every_stage_but_rm_whose_value_head_it_would_drop():
    base = {"dataset": "x.json", "pissa_init": True, "pissa_convert": True}
    for stage in ("sft", "pt", "dpo", "kto"):
        assert validate({**base, "stage": stage, **STAGE_NEEDS.get(stage, {})}, check_paths=False).pissa_convert
    with pytest.raises(InputError) as err:
        validate({**base, "stage": "rm"}, check_paths=False)
    assert err.value.problems[0].key == "pissa_convert" and "stage rm" in str(err.value) and "value head" in str(err.value)


def test_every_stage_runs_the_one_flow_and_sft_only_fills_its_hooks():
    """Issue 30 §2: no recipe replaces the flow (``Recipe.run``: data, prepare, start, train, save,
    measure after, summary); SFT differs only in hooks of it."""
    pytest.importorskip("trl")
    from cockpit.train.recipes import RECIPES, get_recipe
    from cockpit.train.recipes.base import Recipe

    hooks = ("predict_only", "prepare", "start", "measure_after", "final_summary")
    for stage in RECIPES:
        recipe = get_recipe(stage)
        assert isinstance(recipe, Recipe) and type(recipe).run is Recipe.run, stage
        assert recipe.stage == stage and recipe.capabilities.stage == stage
        overridden = {h for h in hooks if getattr(type(recipe), h) is not getattr(Recipe, h)}
        assert overridden == (set(hooks) if stage == "sft" else set()), (stage, overridden)
