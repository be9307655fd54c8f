"""Training stages beyond SFT (issue 17): stage keys, pairwise / KTO / raw-text data with bad rows
by line, the pair report, LLaMA-Factory's packing, the recipe -> TRL mapping, LLaMA-Factory's own
stage examples through ``cockpit check``, and pt / rm runs of the tiny model through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import cockpit, read_events, tiny_config

from cockpit.config.load import load_config, validate
from cockpit.data.formats import DatasetSpec
from cockpit.data.pairs import load_stage_file
from cockpit.errors import InputError

FIXTURES = Path(__file__).parent / "fixtures" / "llamafactory"


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def problems_of(exc: InputError) -> list[str]:
    return [str(p) for p in exc.problems]


# -- config --------------------------------------------------------------------------------
def test_stage_keys_validate_and_cross_key_rules():
    cfg = validate({"dataset": "x.json", "stage": "dpo", "pref_loss": "simpo", "pref_beta": 2.0, "simpo_gamma": 1.0}, check_paths=False)
    assert (cfg.stage, cfg.pref_loss, cfg.pref_beta, cfg.simpo_gamma) == ("dpo", "simpo", 2.0, 1.0)
    with pytest.raises(InputError) as err:
        validate({"dataset": "x.json", "stage": "dpo", "pref_loss": "orpo", "ref_model": "m", "ref_model_adapters": "a"}, check_paths=False)
    msgs = problems_of(err.value)
    assert any("ref_model: pref_loss orpo uses no reference model" in m for m in msgs), msgs
    with pytest.raises(InputError) as err:
        validate({"dataset": "x.json", "stage": "dpo", "ref_model_adapters": "a"}, check_paths=False)
    assert any("ref_model_adapters needs ref_model" in m for m in problems_of(err.value))
    with pytest.raises(InputError) as err:
        validate({"dataset": "x.json", "stage": "dpo", "pref_loss": "ipo", "dpo_label_smoothing": 0.1}, check_paths=False)
    assert any("dpo_label_smoothing applies to pref_loss sigmoid" in m for m in problems_of(err.value))
    with pytest.raises(InputError) as err:
        validate({"dataset": "x.json", "stage": "ppo"}, check_paths=False)
    assert any("stage: must be one of sft | pt | dpo | kto | rm" in m for m in problems_of(err.value))


def test_planner_facts_of_the_stage():
    from cockpit.config.stages import reference_copy, sequences_per_sample

    base = {"finetuning_type": "lora", "pref_loss": "sigmoid"}
    assert sequences_per_sample({**base, "stage": "dpo"}) == 2 and sequences_per_sample({**base, "stage": "rm"}) == 2
    assert sequences_per_sample({**base, "stage": "kto"}) == 1 and sequences_per_sample({**base, "stage": "pt"}) == 1
    assert not reference_copy({**base, "stage": "dpo"})  # LoRA: the base with the adapter disabled
    assert reference_copy({**base, "stage": "dpo", "finetuning_type": "full"})
    assert reference_copy({**base, "stage": "dpo", "ref_model": "other"})
    assert not reference_copy({**base, "stage": "dpo", "finetuning_type": "full", "pref_loss": "orpo"})


# -- data ----------------------------------------------------------------------------------
def test_alpaca_pairs_bad_rows_by_line(tmp_path):
    p = jsonl(
        tmp_path / "pairs.jsonl",
        [
            {"instruction": "Hi", "input": "there", "chosen": "Hello!", "rejected": "Go away."},
            {"instruction": "Same", "chosen": "Yes.", "rejected": " Yes. "},
            {"instruction": "Empty", "chosen": "Fine.", "rejected": ""},
            {"instruction": "Missing", "chosen": "Fine."},
            {"instruction": "", "chosen": "a", "rejected": "b"},
        ],
    )
    res = load_stage_file(DatasetSpec("pairs", p, formatting="alpaca", ranking=True), "dpo")
    assert len(res.samples) == 1
    s = res.samples[0]
    assert s["prompt"] == [{"role": "user", "content": "Hi\nthere"}] and (s["chosen"], s["rejected"]) == ("Hello!", "Go away.")
    msgs = [str(x) for x in res.problems]
    assert msgs == [
        f"{p}:2: chosen and rejected answers are identical (the pair teaches nothing)",
        f"{p}:3: empty rejected answer",
        f"{p}:4: missing rejected answer",
        f"{p}:5: empty 'instruction'",
    ]


def test_sharegpt_pairs_and_kto_tags(tmp_path):
    pairs = jsonl(
        tmp_path / "sg.jsonl",
        [
            {"conversations": [{"from": "human", "value": "你好"}], "chosen": {"from": "gpt", "value": "您好！"}, "rejected": {"from": "gpt", "value": "走开"}},
            {"conversations": [{"from": "human", "value": "q"}], "chosen": {"from": "human", "value": "x"}, "rejected": {"from": "gpt", "value": "y"}},
        ],
    )
    res = load_stage_file(DatasetSpec("sg", pairs, formatting="sharegpt", ranking=True), "rm")
    assert res.samples[0]["prompt"] == [{"role": "user", "content": "你好"}] and res.samples[0]["chosen"] == "您好！"
    assert [str(x) for x in res.problems] == [f"{pairs}:2: chosen: expected an assistant turn, got role 'human'"]
    kto = jsonl(
        tmp_path / "kto.jsonl",
        [
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "label": True},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]},
            {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "c"}], "label": "yes"},
        ],
    )
    spec = DatasetSpec("kto", kto, formatting="sharegpt", columns={"messages": "messages", "kto_tag": "label"}, tags={"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"})
    res = load_stage_file(spec, "kto")
    assert res.samples[0]["completion"] == "a" and res.samples[0]["label"] is True
    assert [str(x) for x in res.problems] == [
        f"{kto}:2: missing KTO tag 'label' (true: a desirable answer, false: an undesirable one)",
        f"{kto}:3: KTO tag 'label' must be true or false, got 'yes'",
    ]


def test_dataset_info_ranking_must_match_the_stage(tmp_path):
    (tmp_path / "data").mkdir()
    jsonl(tmp_path / "data" / "p.jsonl", [{"instruction": "a", "chosen": "b", "rejected": "c"}])
    jsonl(tmp_path / "data" / "s.jsonl", [{"instruction": "a", "output": "b"}])
    (tmp_path / "data" / "dataset_info.json").write_text(json.dumps({"prefs": {"file_name": "p.jsonl", "ranking": True}, "plain": {"file_name": "s.jsonl"}}))
    from cockpit.config.run_config import RunConfig
    from cockpit.data.dataset_info import resolve_datasets

    base = RunConfig(dataset_dir=str(tmp_path / "data"))
    assert resolve_datasets(base.replace(stage="dpo", dataset="prefs"))[0].ranking
    with pytest.raises(InputError) as err:
        resolve_datasets(base.replace(stage="sft", dataset="prefs"))
    assert "a ranking (chosen / rejected) dataset needs stage dpo or rm, not sft" in str(err.value)
    with pytest.raises(InputError) as err:
        resolve_datasets(base.replace(stage="rm", dataset="plain"))
    assert "stage rm needs preference pairs" in str(err.value)


def test_pair_report_counts_truncated_sides_and_lost_responses(tokenizer):
    from cockpit.data.stage_data import answer_lengths, answers_report

    tokenizer.chat_template = tokenizer.chat_template or None
    from cockpit.data.render import apply_template_choice

    apply_template_choice(tokenizer, "chatml")
    short = {"prompt": [{"role": "user", "content": "Hi"}], "chosen": "Hello there.", "rejected": "No."}
    long_chosen = {"prompt": [{"role": "user", "content": "Hi"}], "chosen": "word " * 40, "rejected": "No."}
    long_prompt = {"prompt": [{"role": "user", "content": "word " * 60}], "chosen": "Yes.", "rejected": "No."}
    p_len, (c_len, r_len) = answer_lengths(tokenizer, short["prompt"], [short["chosen"], short["rejected"]])
    assert c_len > r_len > 0 and p_len > 0
    cutoff = p_len + c_len + 2
    rep = answers_report("dpo", tokenizer, [short, long_chosen, long_prompt], cutoff)
    assert rep.samples == 3 and rep.truncated == {"chosen": 2, "rejected": 1} and rep.truncated_any == 2
    assert rep.emptied == 1  # the long prompt alone fills cutoff_len
    assert rep.responses["chosen"]["max"] >= 40 and rep.prompt["max"] >= 60
    lines = "\n".join(rep.lines())
    assert "truncates 2 pairs (2 on the chosen side, 1 on the rejected side)" in lines and "1 pairs lose the whole response" in lines


def test_pretraining_packs_text_plus_eos_into_cutoff_blocks(tokenizer):
    from cockpit.data.stage_data import pack_texts

    texts = ["one two three four five six", "seven eight nine", "ten"]
    stream = [t for x in texts for t in tokenizer(x + tokenizer.eos_token, add_special_tokens=False)["input_ids"]]
    blocks = pack_texts(tokenizer, texts, 4)
    assert all(len(b) == 4 for b in blocks) and len(blocks) == len(stream) // 4
    assert [t for b in blocks for t in b] == stream[: len(blocks) * 4]  # the tail past the last block is dropped
    assert blocks[0].count(tokenizer.eos_token_id) <= 1
    assert pack_texts(tokenizer, ["ab"], 512) == [stream[:0] + tokenizer("ab" + tokenizer.eos_token, add_special_tokens=False)["input_ids"]]


# -- recipes -> TRL ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "keys, trainer, expect",
    [
        ({"pref_loss": "sigmoid"}, "DPOTrainer", {"loss_type": ["sigmoid"], "beta": 0.1}),
        ({"pref_loss": "sigmoid", "dpo_label_smoothing": 0.2}, "DPOTrainer", {"loss_type": ["robust"], "label_smoothing": 0.2}),
        ({"pref_loss": "ipo", "pref_ftx": 0.5}, "DPOTrainer", {"loss_type": ["ipo", "sft"], "loss_weights": [1.0, 0.5]}),
        ({"pref_loss": "hinge", "pref_beta": 0.3}, "DPOTrainer", {"loss_type": ["hinge"], "beta": 0.3}),
        ({"pref_loss": "orpo", "pref_beta": 0.2}, "ORPOTrainer", {"beta": 0.2}),
        ({"pref_loss": "simpo", "simpo_gamma": 0.7, "pref_ftx": 0.1}, "CPOTrainer", {"loss_type": "simpo", "simpo_gamma": 0.7, "cpo_alpha": 0.1}),
    ],
)
def test_pref_loss_maps_to_the_trl_trainer_and_config(tmp_path, keys, trainer, expect):
    from cockpit.train.recipes import get_recipe
    from cockpit.train.recipes.base import RecipeContext, StageData, stage_arguments

    cfg = validate({"dataset": "x.json", "stage": "dpo", "use_cpu": True, "max_steps": 2, **keys}, check_paths=False)
    trainer_cls, config_cls, stage_keys = get_recipe("dpo").trl_classes(cfg)
    assert trainer_cls.__name__ == trainer
    dirs = {"checkpoints": tmp_path / "ck"}
    ctx = RecipeContext(None, cfg, 0, 1, 0, None, 0.0, True, dirs, None, None, print)
    args = stage_arguments(config_cls, ctx, StageData([], [], None), **stage_keys)  # TRL's own config validates the values
    for k, v in expect.items():
        assert getattr(args, k) == v, k
    assert args.max_steps == 2 and args.use_cpu and args.max_length == cfg.cutoff_len and args.learning_rate == cfg.learning_rate


# -- LLaMA-Factory's stage examples ----------------------------------------------------------
@pytest.mark.parametrize("name, stage, samples", [("dpo", "dpo", 5), ("kto", "kto", 10), ("pretrain", "pt", 5), ("reward", "rm", 5)])
def test_llamafactory_stage_examples_pass_check(name, stage, samples, embedded_dir, monkeypatch, tmp_path):
    from cockpit.preflight.checks import check_run

    monkeypatch.chdir(tmp_path)  # output_dir: saves/... is relative
    cfg = load_config(FIXTURES / f"qwen3_lora_{name}.yaml")  # as LLaMA-Factory ships it (kto: 1 sample per micro-batch)
    assert cfg.stage == stage
    result = check_run(cfg, log=lambda *_: None, with_devices=False)
    assert result.samples == samples and not result.bad_rows
    assert result.report.stage == stage and result.report.lines()


# -- runs through the real CLI and supervisor (tiny model) -----------------------------------
def _finished(runs: Path) -> tuple[Path, dict, list[dict]]:
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished", (run / "logs" / "rank0.log").read_text()[-3000:]
    return run, json.loads((run / "summary.json").read_text()), read_events(run)


def test_pt_run_packs_blocks_and_trains_every_token(tmp_path, tiny_model_dir):
    data = jsonl(tmp_path / "raw.jsonl", [{"text": f"Document {i}: kestrels hover over the grass and the river runs to the sea."} for i in range(12)])
    cfg = tiny_config(tmp_path, tiny_model_dir, "pt", stage="pt", dataset=str(data), cutoff_len=32, max_steps=2, probes=None, save_steps=10)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    run, summary, events = _finished(tmp_path / "runs")
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2] and all(e["loss"] > 0 for e in steps)
    # every token is a label: a batch of 2 full 32-token blocks per step
    assert summary["stage"] == "pt" and summary["data"]["blocks"] == summary["blocks"] and summary["tokens_seen"] == 2 * 2 * 32
    assert (run / "adapter" / "adapter_config.json").exists()


def test_rm_run_trains_a_value_head_and_reports_pairwise_accuracy(tmp_path, tiny_model_dir):
    cfg = tiny_config(tmp_path, tiny_model_dir, "rm", stage="rm", dataset="cockpit_identity_pairs", val_size=4, max_steps=2, probes=None, save_steps=10, logging_steps=2)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    run, summary, events = _finished(tmp_path / "runs")
    step = [e for e in events if e["kind"] == "step"][-1]
    assert 0.0 <= step["pairwise_accuracy"] <= 1.0 and "reward_margin" in step
    held = {e["phase"]: e for e in events if e["kind"] == "held_out"}
    assert held["before"]["pairs"] == held["after"]["pairs"] == 4
    assert summary["held_out_after"]["accuracy"] == held["after"]["accuracy"]
    saved = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert saved["task_type"] == "SEQ_CLS" and "score" in (saved.get("modules_to_save") or [])


def test_planner_counts_pairs_reference_copy_and_value_head():
    from cockpit.plan import plan

    base = {"model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "finetuning_type": "lora", "bf16": True, "cutoff_len": 1024}
    sft = plan({**base, "stage": "sft"}).estimate
    dpo = plan({**base, "stage": "dpo"}).estimate
    full_sft = plan({**base, "finetuning_type": "full"}).estimate
    full_dpo = plan({**base, "finetuning_type": "full", "stage": "dpo"}).estimate
    rm = plan({**base, "stage": "rm"}).estimate
    assert dpo.params["tokens_per_micro_batch"] == 2 * sft.params["tokens_per_micro_batch"]
    assert dpo.components["activations_saved"] == pytest.approx(2 * sft.components["activations_saved"])
    names = lambda e: [t.name for t in e.terms]
    assert "reference model" not in names(dpo) and any("adapter disabled" in n for n in dpo.notes)
    ref = next(t for t in full_dpo.terms if t.name == "reference model")
    assert ref.bytes == pytest.approx(full_sft.params["total"] * 2)  # bf16 copy of the base
    assert rm.components["logits"] < dpo.components["logits"] / 1000  # one score per token instead of the vocabulary


# -- cockpit (UI process: no torch) -----------------------------------------------------------
def test_live_screen_shows_the_stage_sparklines_a_run_reports(tmp_path, monkeypatch):
    import asyncio

    from cockpit.store.events import EventWriter
    from cockpit.store.rundir import RunDir, create_run_dir
    from cockpit.ui.screens.live import LiveScreen
    from tests.test_ui_pilot import wait_for
    from tests.test_ui_setup_live import make_app

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    run = create_run_dir(tmp_path / "runs", "dpo")
    run.update_status(state="running", run_id=run.run_id)
    with EventWriter(run.events_path) as w:
        w.emit("train_begin", total_steps=10)
        for step in range(1, 6):
            w.emit("step", step=step, total_steps=10, loss=0.7 - 0.1 * step, lr=1e-3, grad_norm=1.0, tokens_per_s=50.0,
                   reward_margin=0.2 * step, reward_accuracy=min(1.0, 0.5 + 0.1 * step), reward_chosen=0.1 * step, reward_rejected=-0.1 * step)
        w.emit("held_out", phase="before", stage="dpo", pairs=12, accuracy=0.5, mean_logp_margin=-1.0)

    async def scenario() -> None:
        app = make_app(tmp_path / "runs", start="runs")
        async with app.run_test(size=(120, 40)) as pilot:
            app.open_live(RunDir(run.path))
            await wait_for(pilot, lambda: isinstance(app.screen, LiveScreen) and app.screen.state.step == 5, 10, "live")
            live = app.screen
            await wait_for(pilot, lambda: not live.query_one("#stage-sparks").has_class("hidden"), 10, "the stage sparklines")
            for m in ("reward_margin", "reward_accuracy", "reward_chosen", "reward_rejected"):
                assert not live.query_one(f"#row-{m}").has_class("hidden")
            assert live.query_one("#row-pairwise_accuracy").has_class("hidden")  # an rm metric: not reported here
            assert "1.0000" in str(live.query_one("#lbl-reward_margin").render())
            assert live.state.held_out["before"]["accuracy"] == 0.5

    asyncio.run(scenario())


def test_data_check_shows_the_stage_report_and_the_pair_side_by_side():
    from cockpit.ui.forms import data_report

    data = {"ok": True, "samples": 2, "formats": {"p": "alpaca"},
            "truncation": {"stage": "dpo", "lines": ["pairs: 2   prompt tokens: p50 5  p90 5  max 5", "warning: 1 pairs lose the whole response"]},
            "preview": {"source": "p.jsonl:1", "pieces": [{"text": "<|im_start|>user\nWho are you?<|im_end|>\n<|im_start|>assistant\n", "trained": False}, {"text": "I'm Kestrel.", "trained": True}],
                        "pair": {"chosen": "I'm Kestrel.", "rejected": "I'm SmolLM."}}}
    text = data_report(data).plain
    assert "pairs: 2   prompt tokens" in text and "1 pairs lose the whole response" in text
    row = next(line for line in text.splitlines() if "Kestrel" in line and "|" in line)
    assert row.split("|")[0].strip() == "I'm Kestrel." and row.split("|")[1].strip() == "I'm SmolLM."


def test_summary_shows_held_out_accuracy_before_and_after(tmp_path):
    from cockpit.store.rundir import create_run_dir
    from cockpit.ui.screens.summary import summary_text

    run = create_run_dir(tmp_path / "runs", "dpo")
    summary = {"state": "finished", "stage": "dpo", "steps": 18, "total_steps": 18, "runtime_s": 200,
               "held_out_before": {"pairs": 12, "accuracy": 0.5}, "held_out_after": {"pairs": 12, "accuracy": 1.0},
               "data": {"lines": ["pairs: 60   prompt tokens: p50 17  p90 26  max 30"]}}
    text = summary_text(run, summary, {}).plain
    assert "held-out pairs (12): 50% → 100% (policy prefers the chosen answer)" in text and "data: pairs: 60" in text


def test_tune_refuses_a_stage_it_cannot_trial(tmp_path):
    from cockpit.train.tune import tune

    cfg = tmp_path / "dpo.yaml"
    cfg.write_text("stage: dpo\ndataset: cockpit_identity_pairs\n")
    with pytest.raises(InputError) as err:
        tune(str(cfg))
    assert "stage: cockpit tune measures stage sft trials so far" in str(err.value)


# -- one flow: what SFT solved reaches every stage (issue 30, section 2) ------------------------------
@pytest.mark.slow
def test_a_dpo_run_through_a_nan_keeps_the_last_good_checkpoint_as_its_adapter(tmp_path, tiny_model_dir):
    """The NaN rule of the shared flow: the final model never comes from weights trained through a NaN."""
    cfg = tiny_config(tmp_path, tiny_model_dir, "dpo_nan", stage="dpo", dataset="cockpit_identity_pairs", finetuning_type="full",
                      learning_rate=1e6, weight_decay=10.0, max_grad_norm=0.0, max_steps=30, probes=None,
                      nan_policy="stop", save_steps=1, telemetry_interval_s=0)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    summary = json.loads((run / "summary.json").read_text())
    assert res.returncode != 0 and summary["state"] == "failed", res.stdout[-2000:]
    assert summary["nan_step"] and "stopped on NaN" in summary["reason"] and summary["stage"] == "dpo"
    if summary["adapter_from"]:  # a checkpoint before the NaN: its weights are the run's model
        assert summary["adapter_from"] in summary["reason"] and (run / "adapter" / "config.json").exists()
    else:
        assert summary["adapter_dir"] is None and not (run / "adapter").exists()


@pytest.mark.slow
def test_a_dpo_run_converts_its_pissa_adapter_as_sft_does(tmp_path, tiny_model_dir):
    """pissa_convert was accepted for dpo and had no effect: the shared flow saves the initial adapter and converts."""
    cfg = tiny_config(tmp_path, tiny_model_dir, "dpo_pissa", stage="dpo", dataset="cockpit_identity_pairs", max_steps=2,
                      probes=None, save_steps=2, pissa_init=True, pissa_iter=4, pissa_convert=True, lora_rank=4)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    run, summary, _events = _finished(tmp_path / "runs")
    assert summary["pissa_converted"] is True and summary["stage"] == "dpo"
    saved = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert saved["r"] == 8  # rank 2 x lora_rank: the trained PiSSA adapter joined with the initial one
    assert json.loads((run / "checkpoints" / "checkpoint-2" / "adapter_config.json").read_text())["r"] == 4
    assert (run / "pissa_init" / "adapter_config.json").exists()  # saved before the first step
