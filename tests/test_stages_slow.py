"""Preference stages for real (slow tier): the DPO demo preset on the embedded model, and a few
KTO steps on the tiny model, through the real CLI and supervisor."""

from __future__ import annotations

import json
import math

import pytest
from conftest import ROOT, cockpit, read_events, tiny_config


@pytest.mark.budget(240, reason="the DPO demo preset on the embedded 135M model: learning is what it asserts")
@pytest.mark.slow
def test_cpu_dpo_demo_prefers_the_chosen_identity(tmp_path, embedded_dir):
    runs = tmp_path / "runs"
    res = cockpit("train", str(ROOT / "presets" / "cpu-dpo-demo.yaml"), "--runs-dir", str(runs), timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in runs.iterdir() if d.is_dir())
    summary = json.loads((run / "summary.json").read_text())
    print(json.dumps({k: summary[k] for k in ("runtime_s", "train_runtime_s", "held_out_before", "held_out_after", "probes_before", "probes_after")}))
    assert summary["state"] == "finished" and summary["stage"] == "dpo"
    before, after = summary["held_out_before"], summary["held_out_after"]
    assert before["pairs"] == after["pairs"] == 12
    assert before["accuracy"] <= 0.6  # about chance (or worse) before
    assert after["accuracy"] >= 0.85
    assert after["mean_logp_margin"] > before["mean_logp_margin"]
    # the generation probe: the preferred identity shows in the greedy answers
    assert summary["probes_after"]["rate"] >= summary["probes_before"]["rate"] + 0.5
    steps = [e for e in read_events(run) if e["kind"] == "step"]
    assert steps and all("reward_margin" in e and "reward_accuracy" in e for e in steps)
    assert steps[-1]["reward_margin"] > 0


@pytest.mark.slow
def test_kto_runs_a_few_steps_with_tagged_answers(tmp_path, tiny_model_dir):
    rows = []
    for i in range(6):
        rows.append({"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": f"A helpful answer {i}."}], "label": True})
        rows.append({"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": "Go away."}], "label": False})
    data = tmp_path / "data"
    data.mkdir()
    (data / "kto.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "dataset_info.json").write_text(json.dumps({"kto_demo": {"file_name": "kto.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages", "kto_tag": "label"}, "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    cfg = tiny_config(tmp_path, tiny_model_dir, "kto", stage="kto", dataset="kto_demo", dataset_dir=str(data), per_device_train_batch_size=4,
                      max_steps=3, probes=None, save_steps=10, kto_chosen_weight=1.0, kto_rejected_weight=1.5)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in (tmp_path / "runs").iterdir() if d.is_dir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["steps"] == 3
    assert summary["kto_desirable"] == 6 and summary["kto_undesirable"] == 6
    steps = [e for e in read_events(run) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3] and all("kl" in e for e in steps)


@pytest.mark.slow
def test_kto_trains_one_sample_per_micro_batch_with_a_real_kl_term(tmp_path, tiny_model_dir):
    """LLaMA-Factory's per_device_train_batch_size 1 (TRL's KTOTrainer refuses it): the KL pairs are
    built over the dataset (each prompt with another row's answer), so the KL term is not the row's
    own reward, and it moves off 0 once the policy leaves the reference (step 1: LoRA's zero B, kl 0).
    Mostly desirable answers of one shape: training raises them under any prompt, so the KL estimate
    (TRL clamps it at 0) is positive."""
    rows = []
    for i in range(12):
        good = i % 4 != 3
        answer = f"A helpful answer {i}." if good else "Go away."
        rows.append({"messages": [{"role": "user", "content": f"Question {i}?"}, {"role": "assistant", "content": answer}], "label": good})
    data = tmp_path / "data"
    data.mkdir()
    (data / "kto.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (data / "dataset_info.json").write_text(json.dumps({"kto_demo": {"file_name": "kto.jsonl", "formatting": "sharegpt", "columns": {"messages": "messages", "kto_tag": "label"}, "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}}}))
    cfg = tiny_config(tmp_path, tiny_model_dir, "kto1", stage="kto", dataset="kto_demo", dataset_dir=str(data), per_device_train_batch_size=1,
                      max_steps=6, probes=None, save_steps=10)
    res = cockpit("check", str(cfg))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in (tmp_path / "runs").iterdir() if d.is_dir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["steps"] == 6
    steps = [e for e in read_events(run) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3, 4, 5, 6]
    kls = [e["kl"] for e in steps]
    print(json.dumps({"kl": kls, "loss": [e["loss"] for e in steps]}))
    assert all(math.isfinite(k) and k >= 0 for k in kls) and max(kls) > 0, kls


@pytest.mark.slow
@pytest.mark.parametrize("loss,extra", [("orpo", {"pref_beta": 0.1}), ("simpo", {"pref_beta": 2.0, "simpo_gamma": 0.5, "pref_ftx": 0.1})])
def test_orpo_and_simpo_train_end_to_end_without_a_reference(tmp_path, tiny_model_dir, loss, extra):
    """pref_loss orpo (TRL's ORPOTrainer) and simpo (CPOTrainer, loss_type simpo) through the real
    CLI and supervisor: steps with the preference metrics, held-out pairs before and after, an
    adapter saved; neither builds a reference model."""
    cfg = tiny_config(tmp_path, tiny_model_dir, loss, stage="dpo", pref_loss=loss, dataset="cockpit_identity_pairs", val_size=4,
                      max_steps=2, logging_steps=1, probes=None, save_steps=10, **extra)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in (tmp_path / "runs").iterdir() if d.is_dir())
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["steps"] == 2
    events = read_events(run)
    steps = [e for e in events if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2]
    assert all(math.isfinite(e["loss"]) and "reward_margin" in e and "reward_accuracy" in e for e in steps), steps
    held = {e["phase"]: e for e in events if e["kind"] == "held_out"}
    assert held["before"]["pairs"] == held["after"]["pairs"] == 4
    for phase in ("before", "after"):  # the scoring says how far it is: from 0 to the 4 pairs
        done = [e["done"] for e in events if e["kind"] == "progress" and e["task"] == "held_out" and e["phase"] == phase]
        assert done[0] == 0 and done[-1] == 4 and done == sorted(done), (phase, done)
    kinds = [e["kind"] for e in events]  # the held-out result comes before the run's end
    assert kinds.index("held_out", kinds.index("train_begin")) < kinds.index("run_finished")
    assert (run / "adapter" / "adapter_config.json").exists()
    trainer = "ORPOTrainer" if loss == "orpo" else "CPOTrainer"
    assert summary["trainer"] == trainer
    assert f"dpo (pref_loss {loss}): {trainer}, reference model: none" in (run / "logs" / "rank0.log").read_text()


@pytest.mark.slow
def test_dpo_on_two_ranks_asks_probes_and_held_out_on_the_placed_model(tmp_path, tiny_model_dir):
    """Probes and the held-out measure before training run at on_train_begin, once the Trainer has
    placed the model (not on the host while the other rank waits in a collective): under DDP on 2
    gloo ranks both ranks ask the probes, rank 0 reports them and the held-out pairs, after
    train_begin; the run finishes with both in its summary."""
    from test_stage_keys import pair_file

    data = pair_file(tmp_path / "pairs.jsonl", n=10)
    cfg = tiny_config(tmp_path, tiny_model_dir, "dpo2", stage="dpo", dataset=str(data), val_size=2, nproc_per_node=2,
                      per_device_train_batch_size=2, max_steps=2, save_steps=10, probe_max_new_tokens=4)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run = next(d for d in (tmp_path / "runs").iterdir() if d.is_dir())
    kinds = [(e["kind"], e.get("phase")) for e in read_events(run)]
    begin = kinds.index(("train_begin", None))
    assert kinds.index(("probe_results", "before")) > begin and kinds.index(("held_out", "before")) > begin
    before = [e for e in read_events(run) if e["kind"] == "probe_results" and e["phase"] == "before"]
    assert len(before) == 1 and before[0]["device"] == "cpu" and before[0]["total"] > 0
    for rank in (0, 1):
        assert "probes before training" in (run / "logs" / f"rank{rank}.log").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["state"] == "finished" and summary["probes_before"]["total"] == before[0]["total"]
    assert summary["held_out_before"]["pairs"] == 2 and summary["held_out_after"]["pairs"] == 2
