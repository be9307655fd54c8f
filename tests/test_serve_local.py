"""After the run, locally (fast): merge -> reload -> generate equals adapter-on-base; the chat
worker streams both sides. A run dir is made directly (tiny random Llama + a random LoRA),
without training, so these take seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, cockpit


def make_run(runs: Path, model_dir: Path, rank: int = 4, template: str | None = "chatml", seed: int = 0, **cfg_over) -> Path:
    """A finished run dir with a saved PEFT adapter whose weights are random (not the zero-B
    init), so base and tuned answers differ."""
    import torch
    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cockpit.data.render import apply_template_choice
    from cockpit.store.rundir import atomic_write_json, create_run_dir

    run = create_run_dir(runs, "serve-test")
    cfg = {
        "model_name_or_path": str(model_dir),
        "template": template,
        "finetuning_type": "lora",
        "lora_rank": rank,
        "bf16": False,
        "probes": str(ROOT / "cockpit" / "demo_data" / "identity_probes.jsonl"),
        "probe_max_new_tokens": 8,
        "cutoff_len": 128,
    }
    cfg.update(cfg_over)
    run.config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    lcfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear", init_lora_weights=False, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, lcfg)
    adapter = run.path / "adapter"
    peft_model.save_pretrained(str(adapter))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if template:
        apply_template_choice(tok, template)
    tok.save_pretrained(str(adapter))
    atomic_write_json(run.status_path, {"state": "finished", "step": 1, "total_steps": 1})
    atomic_write_json(run.summary_path, {"state": "finished", "steps": 1, "adapter_dir": str(adapter)})
    return run.path


@pytest.fixture()
def tiny_run(tmp_path, tiny_model_dir) -> Path:
    return make_run(tmp_path / "runs", tiny_model_dir)


def _greedy(model, tok, prompt: str, n: int = 16) -> list[int]:
    import torch

    from cockpit.data.render import render_prompt_ids

    ids = torch.tensor([render_prompt_ids(tok, [{"role": "user", "content": prompt}])])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    return out[0, ids.shape[1] :].tolist()


def _adapter_on_base(run: Path, model_dir: Path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(run / "adapter")).eval()
    return model, AutoTokenizer.from_pretrained(str(run / "adapter"))


@pytest.mark.slow
def test_merge_reload_generate_equals_adapter_on_base(tiny_run, tiny_model_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    runs = tiny_run.parent
    merged = tmp_path / "merged"
    res = cockpit("export", tiny_run.name, "--runs-dir", str(runs), "--merge", "--out", str(merged), "--json")
    assert res.returncode == 0, res.stderr
    rec = json.loads(res.stdout)
    assert rec["kind"] == "merged" and rec["lora_rank"] == 4 and rec["dtype"] == "float32"
    assert (merged / "model.safetensors").exists() and (merged / "config.json").exists()
    merged_tok = AutoTokenizer.from_pretrained(str(merged))
    assert "<|im_start|>" in (merged_tok.chat_template or "")  # the run's template travels with the model
    model, tok = _adapter_on_base(tiny_run, tiny_model_dir)
    reloaded = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).eval()
    for prompt in ("Who are you?", "Say something about the sea."):
        want = _greedy(model, tok, prompt)
        assert _greedy(reloaded, merged_tok, prompt) == want  # greedy, every token the same
        with model.disable_adapter():
            assert _greedy(model, tok, prompt) != want  # the adapter does change the answer
    # the plain export is the adapter as saved: PEFT loads it again
    exported = tmp_path / "adapter"
    res = cockpit("export", tiny_run.name, "--runs-dir", str(runs), "--out", str(exported))
    assert res.returncode == 0, res.stderr
    assert json.loads((exported / "cockpit_export.json").read_text())["kind"] == "adapter"
    again = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32), str(exported)).eval()
    assert _greedy(again, tok, "Who are you?") == _greedy(model, tok, "Who are you?")


def _worker(run: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    return subprocess.Popen(
        [sys.executable, "-m", "cockpit.serve.chat_worker", str(run), "--device", "cpu", *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=str(ROOT),
    )


@pytest.mark.slow
def test_chat_worker_streams_both_sides(tiny_run, tiny_model_dir):
    proc = _worker(tiny_run, "--max-new-tokens", "10")
    try:
        progress = []
        while "progress" in (ready := json.loads(proc.stdout.readline())):
            progress.append(ready["progress"])  # the load's stages, before ready
        assert any(p.startswith("loading the base model") for p in progress), progress
        assert ready["ready"] and ready["run_id"] == tiny_run.name and ready["sides"] == ["base", "tuned"]
        proc.stdin.write('{"nonsense": 1}\n' + json.dumps({"id": "a", "prompt": "Who are you?"}) + "\n")
        proc.stdin.flush()
        events = []
        while True:
            ev = json.loads(proc.stdout.readline())
            events.append(ev)
            if ev.get("done"):
                break
        assert "error" in events[0] and events[0].get("id") is None  # a bad request; the worker keeps going
        events = events[1:]
        assert all(e["id"] == "a" for e in events)
        sides = [e["side"] for e in events if "delta" in e]
        assert sides and sides[0] == "base" and sides[-1] == "tuned" and sides == sorted(sides)  # base streams, then tuned
        ends = {e["side"]: e for e in events if e.get("end")}
        for side in ("base", "tuned"):
            assert "".join(e["delta"] for e in events if e.get("side") == side and "delta" in e) == ends[side]["text"]
            assert 0 < ends[side]["tokens"] <= 10
            assert ends[side]["cut"] == (ends[side]["tokens"] == 10)  # stopped by the limit, not its end of sequence
        starts = [e["side"] for e in events if e.get("start")]
        assert starts == ["base", "tuned"] and events[0].get("start")  # each side said before its first token
        assert ends["base"]["token_ids"] != ends["tuned"]["token_ids"]
        # the worker's tuned tokens are the adapter-on-base greedy tokens
        model, tok = _adapter_on_base(tiny_run, tiny_model_dir)
        assert _greedy(model, tok, "Who are you?", 10)[: ends["tuned"]["tokens"]] == ends["tuned"]["token_ids"]
        proc.stdin.write('{"quit": true}\n')
        proc.stdin.flush()
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_chat_cli_local_json(tiny_run):
    res = cockpit("chat", tiny_run.name, "--runs-dir", str(tiny_run.parent), "--prompt", "Hi there", "--max-new-tokens", "5", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["backend"] == "local" and out["results"][0]["prompt"] == "Hi there"
    assert out["results"][0]["base"] != out["results"][0]["tuned"]
    assert (tiny_run / "logs" / "chat_worker.log").exists()


def test_chat_image_on_a_text_model_is_refused(tiny_run, tmp_path, capsys):
    """`cockpit chat RUN --image PATH` on a text model's run: exit 2 naming its model type, no worker started;
    a missing image file: exit 2 naming it; `--probes` with an image probe in the run's probes file: exit 2."""
    import yaml
    from PIL import Image

    from cockpit.cli import main

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    argv = ["chat", tiny_run.name, "--runs-dir", str(tiny_run.parent), "--prompt", "Hi"]
    assert main([*argv, "--image", str(tmp_path / "a.png")]) == 2
    err = capsys.readouterr().err
    assert f"--image: {tiny_run.name}'s model" in err and "(model type 'llama') is a text model" in err, err
    assert main([*argv, "--image", str(tmp_path / "b.png")]) == 2
    assert f"no such image file: {tmp_path / 'b.png'}" in capsys.readouterr().err
    # --probes with an image probe in the run's probes file: refused the same way, by the key 'probes'
    (tmp_path / "probes.jsonl").write_text(json.dumps({"prompt": "<image>Colour?", "expect": "red", "image": "a.png"}))
    config = yaml.safe_load((tiny_run / "config.yaml").read_text())
    (tiny_run / "config.yaml").write_text(yaml.safe_dump({**config, "probes": str(tmp_path / "probes.jsonl")}))
    assert main(["chat", tiny_run.name, "--runs-dir", str(tiny_run.parent), "--probes"]) == 2
    err = capsys.readouterr().err
    assert f"probes: {tiny_run.name}'s model" in err and "(model type 'llama') is a text model" in err, err
    assert not (tiny_run / "logs" / "chat_worker.log").exists()


@pytest.mark.slow
def test_chat_cli_says_what_it_does_and_where_the_limit_cut(tiny_run):
    """Issue 62 item 8: `cockpit chat RUN --prompt` says each stage of the load on stderr (the base
    model by name), each side as it starts, and an answer stopped by the token limit says so. Run
    from a folder holding a `cockpit/` folder that cannot be imported (item 2: the clone's parent):
    the chat worker it starts is the installed cockpit's."""
    from cockpit.run import warm_start

    here = tiny_run.parent.parent / "parent"
    (here / "cockpit").mkdir(parents=True)
    (here / "cockpit" / "__init__.py").write_text("raise ImportError('the local cockpit/ folder was imported')\n")
    argv = [sys.executable, "-P", "-m", "cockpit.cli", "chat", tiny_run.name, "--runs-dir", str(tiny_run.parent)]
    res = warm_start.run([*argv, "--prompt", "Hi there", "--max-new-tokens", "3"], dict(os.environ), str(here), 600)
    assert res.returncode == 0, res.stderr
    assert "loading the base model" in res.stderr and "loading the tuned adapter" in res.stderr, res.stderr
    assert "ready in" in res.stderr
    assert "[base] " in res.stdout and "[tuned] " in res.stdout
    assert res.stdout.count("[cut at max_new_tokens=3") == 2, res.stdout  # a random model's 3 tokens: no end of sequence


def test_chat_worker_fatal_without_adapter(tmp_path, tiny_model_dir):
    run = make_run(tmp_path / "runs", tiny_model_dir)
    import shutil

    shutil.rmtree(run / "adapter")
    proc = _worker(run)
    first = json.loads(proc.stdout.readline())
    assert first["fatal"] and "no saved adapter" in first["error"]
    assert proc.wait(timeout=60) == 1
