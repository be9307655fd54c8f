"""QLoRA for real on the CPU: bitsandbytes' own wheel carries CPU kernels for NF4 and LLM.int8, so
``quantization_bit: 4 | 8`` trains the embedded model here through the code a GPU rank runs.

bitsandbytes lives off the suite's sys.path (the ``bnb_env`` fixture: ``<venv>/lowrank-site``);
each run, and each in-process look at the loaded model, is a subprocess with it on PYTHONPATH."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cockpit, read_events, start_detached, wait_for, write_yaml

def linears(model_dir: Path) -> int:
    """The model's linear layers below the head: 7 per decoder layer (q k v o gate up down); the embedded
    model has 30 layers (210), the tiny Llama 2 (14)."""
    return 7 * json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]


def qlora_config(tmp_path: Path, model_dir: Path, bits: int, name: str = "", **over) -> Path:
    """A few-step QLoRA run of the embedded model on the identity data: short samples, no probes."""
    cfg = {
        "model_name_or_path": str(model_dir),
        "template": "chatml",
        "dataset": "cockpit_identity",
        "finetuning_type": "lora",
        "quantization_bit": bits,
        "quantization_method": "bitsandbytes",  # LLaMA-Factory's otfq example's spelling
        "bf16": True,
        "lora_rank": 4,
        "lora_target": "all",
        "cutoff_len": 64,
        "max_samples": 16,
        "per_device_train_batch_size": 2,
        "learning_rate": 5e-3,
        "max_steps": 4,
        "logging_steps": 1,
        "save_steps": 4,
        "probes": None,
        "use_cpu": True,
        "telemetry_interval_s": 0.5,
        **over,
    }
    return write_yaml(tmp_path / f"{name or f'q{bits}'}.yaml", cfg)


_LOADED = """
import json, sys, yaml
import bitsandbytes as bnb, torch
from cockpit.config import validate
from cockpit.models.resolve import resolve_model
from cockpit.train.model import build_model

cfg = validate(yaml.safe_load(open(sys.argv[1])))
model = build_model(cfg, resolve_model(cfg.model_name_or_path, log=lambda *_: None), bool(cfg.use_cpu), 0)
kind = bnb.nn.Linear4bit if cfg.quantization_bit == 4 else bnb.nn.Linear8bitLt
quantized = [m for m in model.modules() if isinstance(m, kind)]
plain = [n for n, m in model.named_modules() if type(m) is torch.nn.Linear and "lora_" not in n and "lm_head" not in n]
print(json.dumps({
    "quantized": len(quantized),
    "weight_dtypes": sorted({str(m.weight.dtype) for m in quantized}),
    "packed": all(m.weight.numel() * (2 if cfg.quantization_bit == 4 else 1) == m.in_features * m.out_features
                  for m in quantized),
    "quant_state": all(getattr(m.weight, "quant_state", None) is not None for m in quantized)
                   if cfg.quantization_bit == 4 else True,
    "plain_linears": plain,
    "trainable": sorted({n.split(".")[-2] for n, p in model.named_parameters() if p.requires_grad}),
    "device": sorted({str(p.device) for p in model.parameters()}),
    "unquantized_dtypes": sorted({str(p.dtype) for n, p in model.named_parameters()
                                  if "lora_" not in n and p.dtype not in (torch.uint8, torch.int8)}),
    "checkpointing_reentrant": sorted({getattr(getattr(m, "_gradient_checkpointing_func", None), "keywords", {})
                                       .get("use_reentrant") for m in model.modules()
                                       if getattr(m, "gradient_checkpointing", False)}, key=str),
}))
"""


def loaded(cfg: Path, env: dict) -> dict:
    """What :func:`cockpit.train.model.build_model` (the rank's loader) makes of ``cfg``."""
    res = subprocess.run([sys.executable, "-c", _LOADED, str(cfg)], env={**os.environ, **env}, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train(tmp_path: Path, cfg: Path, env: dict) -> Path:
    runs = tmp_path / f"runs-{cfg.stem}"
    res = cockpit("train", str(cfg), "--runs-dir", str(runs), env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return next(runs.iterdir())


def assert_only_lora_trained(run: Path, model_dir: Path, base_sha: str, steps: int) -> list[float]:
    """The base's weights file untouched, the adapter all LoRA matrices of every linear layer, its
    B matrices (zero at init) moved; the losses of the run's steps."""
    from safetensors.torch import load_file

    assert sha(model_dir / "model.safetensors") == base_sha
    adapter = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter), sorted(adapter)[:5]
    b = [t for k, t in adapter.items() if ".lora_B." in k]
    assert len(b) == linears(model_dir) and all(t.abs().max() > 0 for t in b)
    losses = [e["loss"] for e in read_events(run) if e["kind"] == "step"]
    assert len(losses) == steps, losses
    return losses


@pytest.mark.slow
def test_qlora_4bit_trains_only_the_adapter_over_nf4_weights(tmp_path, embedded_dir, bnb_env):
    """``quantization_bit: 4`` on the CPU: every linear layer of the base is a bitsandbytes
    ``Linear4bit`` holding packed NF4 bytes (two weights a byte) with its quantization state, only
    LoRA matrices train, and four steps bring the loss down."""
    cfg = qlora_config(tmp_path, embedded_dir, 4)
    seen = loaded(cfg, bnb_env)
    assert seen["quantized"] == linears(embedded_dir) and seen["plain_linears"] == [], seen
    assert seen["weight_dtypes"] == ["torch.uint8"] and seen["packed"] and seen["quant_state"], seen
    assert seen["trainable"] == ["default"] and seen["device"] == ["cpu"], seen  # lora_A.default.weight ...
    # embeddings, lm_head and norms keep the run's bf16, as LLaMA-Factory keeps them (PEFT's
    # prepare_model_for_kbit_training made them fp32: 2 bytes a parameter more)
    assert seen["unquantized_dtypes"] == ["torch.bfloat16"], seen

    base_sha = sha(embedded_dir / "model.safetensors")
    run = train(tmp_path, cfg, bnb_env)
    losses = assert_only_lora_trained(run, embedded_dir, base_sha, 4)
    assert losses[-1] < losses[0] * 0.8, losses
    assert "quantization_bit: 4" in (run / "config.yaml").read_text()
    assert_merged_into_unquantized_base(tmp_path, run, embedded_dir)


def assert_merged_into_unquantized_base(tmp_path: Path, run: Path, model_dir: Path) -> None:
    """``cockpit export --merge`` (no bitsandbytes on its path): the adapter merged into the base's
    own bf16 weights (the run's precision), never a quantized or dequantized copy; the merged model
    loads as a plain model, computes what base + adapter compute, and answers."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    res = cockpit("export", run.name, "--runs-dir", str(run.parent), "--merge", "--out", str(out), "--json")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    record = json.loads(res.stdout)
    assert record["dtype"] == "bfloat16" and any("unquantized base weights (bfloat16)" in n for n in record["notes"])
    merged = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert getattr(merged.config, "quantization_config", None) is None
    assert {p.dtype for p in merged.parameters()} == {torch.bfloat16}
    assert not any("lora" in n for n, _ in merged.named_parameters())
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    plain = base.model.layers[0].self_attn.q_proj.weight.detach().clone()
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight, plain)  # the adapter is in
    with_adapter = PeftModel.from_pretrained(base, str(run / "adapter")).eval()
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok.apply_chat_template([{"role": "user", "content": "Who are you?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        a, b = merged(ids).logits.float(), with_adapter(ids).logits.float()
        answer = merged.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1]:]
    assert (a - b).abs().max() < 0.05 * b.abs().max(), ((a - b).abs().max(), b.abs().max())  # bf16 rounding apart
    assert tok.decode(answer, skip_special_tokens=True).strip()


@pytest.mark.slow
def test_qlora_8bit_trains_only_the_adapter_over_int8_weights(tmp_path, tiny_model_dir, bnb_env):
    """``quantization_bit: 8`` (LLM.int8) on the CPU: ``Linear8bitLt`` layers with int8 weights,
    the adapter trains, the loss falls (the tiny Llama: the same layers, what is asserted holds for any base)."""
    cfg = qlora_config(tmp_path, tiny_model_dir, 8, max_steps=3, save_steps=3)
    seen = loaded(cfg, bnb_env)
    assert seen["quantized"] == linears(tiny_model_dir) and seen["plain_linears"] == [], seen
    assert seen["weight_dtypes"] == ["torch.int8"] and seen["packed"], seen

    base_sha = sha(tiny_model_dir / "model.safetensors")
    run = train(tmp_path, cfg, bnb_env)
    losses = assert_only_lora_trained(run, tiny_model_dir, base_sha, 3)
    assert losses[-1] < losses[0], losses


@pytest.mark.slow
@pytest.mark.parametrize(("over", "reentrant"), [({"gradient_checkpointing": True, "use_reentrant_gc": True}, [True]),
                                                 ({"gradient_checkpointing": True}, [False]), ({}, [])])
def test_kbit_preparation_honours_the_checkpointing_keys(tmp_path, tiny_model_dir, bnb_env, over, reentrant):
    """The 4-bit base's preparation (``prepare_quantized_base``) switches checkpointing on as the
    Trainer gets it (gradient_checkpointing unless disable_gradient_checkpointing, and
    use_reentrant_gc), so a 4-bit base checkpoints exactly when asked, the way asked."""
    seen = loaded(qlora_config(tmp_path, tiny_model_dir, 4, **over), bnb_env)
    assert seen["checkpointing_reentrant"] == reentrant, seen


@pytest.mark.slow
def test_qlora_ddp_on_two_cpu_ranks_matches_one_rank(tmp_path, tiny_model_dir, bnb_env):
    """QLoRA under DDP (gloo, 2 CPU ranks, each holding its own 4-bit base): the same losses as one
    rank with the same global batch, bf16's rounding of other batch shapes apart (measured
    2026-12-03 with a cosine schedule: 4.0248 / 2.7795 / 2.0855 against 4.0248 / 2.7873 / 2.0829)."""
    common = dict(max_steps=3, save_strategy="no", lr_scheduler_type="constant", numa_bind="off", seed=7)
    ddp = train(tmp_path, qlora_config(tmp_path, tiny_model_dir, 4, "ddp", nproc_per_node=2, **common), bnb_env)
    one = train(tmp_path, qlora_config(tmp_path, tiny_model_dir, 4, "one", per_device_train_batch_size=4, **common),
                bnb_env)
    launch = json.loads((ddp / "launch.json").read_text())
    assert launch["strategy"] == "DDP" and len(launch["ranks"]) == 2
    assert sorted(e["rank"] for e in read_events(ddp) if e["kind"] == "rank_started") == [0, 1]
    a, b = ([e["loss"] for e in read_events(r) if e["kind"] == "step"] for r in (ddp, one))
    assert len(a) == len(b) == 3 and abs(a[0] - b[0]) <= 1e-3 * b[0], (a, b)
    assert all(abs(x - y) <= 2e-2 * y for x, y in zip(a, b)) and a[-1] < a[0], (a, b)


@pytest.mark.slow
def test_planner_qlora_estimate_within_15_percent_of_a_measured_cpu_run(tmp_path, embedded_dir, bnb_env):
    """test_plan_measure's tolerance for QLoRA: the planner's tensor peak (NF4 + double-quant
    linears, embeddings/norms in the run's bf16, LoRA, AdamW, activations, logits,
    dequantize buffer) against the live-tensor tracker's peak of a real 2-step 4-bit run of the
    embedded model (cpu_memory_tracker), on rows longer than cutoff_len and with the prompt labelled
    too (train_on_prompt): every micro-batch full and every position in the loss, as the plan
    assumes. 2026-12-03, embeddings and norms in bf16: predicted 282 MiB, measured 256 MiB (1.10).
    (With PEFT's fp32 upcast and the short identity rows it had been 336 / 314 MiB: the short rows'
    smaller activations hid the fp32 residual stream the planner did not count.)"""
    import yaml

    from cockpit.plan import estimate_config

    words = "the river runs past the old mill and the team writes down every number they see".split()
    rows = [{"instruction": " ".join(words[i % 5 :]), "input": "", "output": " ".join(words * 6)} for i in range(16)]
    (tmp_path / "long.json").write_text(json.dumps(rows), encoding="utf-8")
    (tmp_path / "dataset_info.json").write_text(json.dumps({"long": {"file_name": "long.json"}}), encoding="utf-8")
    cfg = qlora_config(tmp_path, embedded_dir, 4, "mem", max_steps=2, save_strategy="no", cpu_memory_tracker=True,
                       dataset="long", dataset_dir=str(tmp_path), train_on_prompt=True)
    run = train(tmp_path, cfg, bnb_env)
    mems = [m for e in read_events(run) if e["kind"] == "step" for m in e["mem"].values()]
    assert mems and all(m["source"] == "live_tensors" for m in mems), mems
    measured = max(m["peak_mb"] for m in mems) * 2**20
    predicted = estimate_config(yaml.safe_load(cfg.read_text()))[1].tensor_peak
    assert abs(predicted / measured - 1) < 0.15, (predicted / 2**20, measured / 2**20)


@pytest.mark.slow
def test_qlora_run_asks_probes_stops_at_a_checkpoint_resumes_and_chats(tmp_path, embedded_dir, bnb_env):
    """The rest of a run's life on a 4-bit base: probes before and after (generation through the
    Linear4bit layers), a stop that saves a checkpoint, ``cockpit resume`` loading the 4-bit base and
    the checkpoint's adapter and optimizer to finish, and ``cockpit chat`` answering with the adapter
    (on the unquantized base: no bitsandbytes on its path)."""
    cfg = qlora_config(tmp_path, embedded_dir, 4, "life", max_steps=6, save_steps=100, max_samples=8,
                       probes="@demo/identity_probes.jsonl", probe_max_new_tokens=4)
    run = start_detached(tmp_path, cfg, env=bnb_env)
    wait_for(lambda: any(e["kind"] == "step" for e in read_events(run)), 600, "the first step")
    cockpit("stop", str(run), "--wait", "600")
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped", status
    saved = [e["step"] for e in read_events(run) if e["kind"] == "checkpoint_saved"]
    assert saved and saved[-1] < 6, saved
    res = cockpit("resume", str(run), env=bnb_env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["attempt"] == 2 and status["step"] == 6, status
    events = read_events(run)
    steps = [e["step"] for e in events if e["kind"] == "step"]
    assert steps[-1] == 6 and steps.count(saved[-1] + 1) == 1, steps  # attempt 2 went on from the checkpoint
    probes = {e["phase"] for e in events if e["kind"] == "probe_results"}
    assert {"before", "after"} <= probes, probes
    chat = cockpit("chat", str(run), "--prompt", "Who are you?", "--max-new-tokens", "5", "--json", timeout=600)
    assert chat.returncode == 0, chat.stdout[-3000:] + chat.stderr[-3000:]
    answer = json.loads(chat.stdout)["results"][0]
    assert answer["prompt"] == "Who are you?" and answer["tuned"].strip() and len(answer["tuned_token_ids"]) == 5


@pytest.mark.gpu
def test_qlora_4bit_steps_on_a_gpu(tmp_path, embedded_dir, bnb_env):
    """The GPU twin (scripts/gpu_check.sh runs ``pytest -m gpu``): the base placed as NF4 on cuda:0
    at load, two QLoRA steps, the doctor's Linear4bit smoke on the GPU (CI: skipped)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU here")
    cfg = qlora_config(tmp_path, embedded_dir, 4, "gpu", use_cpu=False, max_steps=2, save_strategy="no")
    seen = loaded(cfg, bnb_env)
    assert seen["quantized"] == linears(embedded_dir) and seen["device"] == ["cuda:0"], seen
    run = train(tmp_path, cfg, bnb_env)
    assert len([e for e in read_events(run) if e["kind"] == "step"]) == 2
    res = subprocess.run([sys.executable, "-c", _DOCTOR.replace('facts=TorchFacts(importable=True, version="cpu")', "")],
                         env={**os.environ, **bnb_env}, cwd=str(ROOT), capture_output=True, text=True, timeout=600)
    check = json.loads(res.stdout.strip().splitlines()[-1])
    assert check["status"] == "pass" and check["data"]["smoke"]["device"] == "cuda:0", check


# LLaMA-Factory's examples/train_qlora/*_otfq.yaml (on-the-fly bitsandbytes quantization), as written
LF_OTFQ = {
    "llama3_lora_sft_otfq": "quantization_bit: 4\nquantization_method: bitsandbytes  # choices: [bitsandbytes (4/8), hqq (2/3/4/5/6/8), eetq (8)]\n"
    "stage: sft\ndo_train: true\nfinetuning_type: lora\nlora_target: all\ndataset: identity,alpaca_en_demo\n"
    "template: llama3\ncutoff_len: 2048\nmax_samples: 1000\noverwrite_cache: true\npreprocessing_num_workers: 16\n"
    "output_dir: saves/llama3-8b/lora/sft\nlogging_steps: 10\nsave_steps: 500\nplot_loss: true\n"
    "overwrite_output_dir: true\nper_device_train_batch_size: 1\ngradient_accumulation_steps: 8\n"
    "learning_rate: 1.0e-4\nnum_train_epochs: 3.0\nlr_scheduler_type: cosine\nwarmup_ratio: 0.1\nbf16: true\n"
    "ddp_timeout: 180000000\nval_size: 0.1\nper_device_eval_batch_size: 1\neval_strategy: steps\neval_steps: 500\n",
    "qwen3_lora_sft_otfq": "quantization_bit: 4  # choices: [8 (bnb/hqq/eetq), 4 (bnb/hqq), 3 (hqq), 2 (hqq)]\n"
    "quantization_method: bnb  # choices: [bnb, hqq, eetq]\ntrust_remote_code: true\nstage: sft\ndo_train: true\n"
    "finetuning_type: lora\nlora_rank: 8\nlora_target: all\ndataset: identity,alpaca_en_demo\n"
    "template: qwen3_nothink\ncutoff_len: 2048\nmax_samples: 1000\npreprocessing_num_workers: 16\n"
    "dataloader_num_workers: 4\noutput_dir: saves/qwen3-4b/lora/sft\nlogging_steps: 10\nsave_steps: 500\n"
    "plot_loss: true\noverwrite_output_dir: true\nsave_only_model: false\nreport_to: none\n"
    "per_device_train_batch_size: 1\ngradient_accumulation_steps: 8\nlearning_rate: 1.0e-4\nnum_train_epochs: 3.0\n"
    "lr_scheduler_type: cosine\nwarmup_ratio: 0.1\nbf16: true\nddp_timeout: 180000000\n",
}


@pytest.mark.parametrize("name", sorted(LF_OTFQ))
def test_llamafactory_otfq_examples_load_with_the_embedded_model(tmp_path, embedded_dir, name):
    """The QLoRA examples' quantization keys are Cockpit's own: bitsandbytes (LLaMA-Factory spells it
    ``bnb`` or ``bitsandbytes``), NF4, double quantization; the base loads as NF4 with double
    quantization on the rank's device (the CPU here), computing in bf16."""
    import torch

    from cockpit.config import load_config
    from cockpit.models.resolve import resolve_model
    from cockpit.train.model import base_load_kwargs

    path = tmp_path / f"{name}.yaml"
    path.write_text(f"model_name_or_path: {embedded_dir}\n" + LF_OTFQ[name])
    cfg = load_config(path, check_paths=False)
    assert cfg.quantization_bit == 4 and cfg.quantization_method in ("bnb", "bitsandbytes")
    assert cfg.quantization_type == "nf4" and cfg.double_quantization is True
    kwargs = base_load_kwargs(cfg, resolve_model(cfg.model_name_or_path, log=lambda *_: None), True, 0)
    q = kwargs["quantization_config"]
    assert q.load_in_4bit and q.bnb_4bit_quant_type == "nf4" and q.bnb_4bit_use_double_quant
    assert q.bnb_4bit_compute_dtype == torch.bfloat16 and kwargs["device_map"] == {"": "cpu"}
    fp4 = base_load_kwargs(cfg.replace(quantization_type="fp4", double_quantization=False),
                           resolve_model(cfg.model_name_or_path, log=lambda *_: None), True, 0)["quantization_config"]
    assert fp4.bnb_4bit_quant_type == "fp4" and not fp4.bnb_4bit_use_double_quant


def test_other_quantization_methods_are_refused(tmp_path, embedded_dir):
    res = cockpit("check", str(write_yaml(tmp_path / "hqq.yaml", {"model_name_or_path": str(embedded_dir),
                  "dataset": "cockpit_identity", "quantization_bit": 4, "quantization_method": "hqq"})))
    assert res.returncode == 2 and "quantization_method" in res.stdout + res.stderr


def test_fsdp_with_a_quantized_base_is_refused_with_the_reason_and_ddp_offered():
    from cockpit.config import validate
    from cockpit.errors import InputError

    with pytest.raises(InputError) as err:
        validate({"dataset": "cockpit_identity", "quantization_bit": 4, "fsdp": "full_shard auto_wrap",
                  "nproc_per_node": 2, "use_cpu": True})
    text = str(err.value)
    assert "fsdp:" in text and "bnb_4bit_quant_storage" in text and "train QLoRA with DDP" in text


_DOCTOR = """
import json
from cockpit.doctor import run_checks
from cockpit.doctor.facts import TorchFacts
print(json.dumps(run_checks(only=["bitsandbytes"], facts=TorchFacts(importable=True, version="cpu"))[0].to_dict()))
"""


def test_doctor_runs_a_linear4bit_step_of_the_real_bitsandbytes_on_the_cpu(bnb_env):
    """The doctor's bitsandbytes check against the installed package: it does not trust the import
    but runs a tiny NF4 ``Linear4bit`` forward, backward and one-row decode on the CPU (the training
    device here), each matching the dequantized weights."""
    res = subprocess.run([sys.executable, "-c", _DOCTOR], env={**os.environ, **bnb_env}, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    check = json.loads(res.stdout.strip().splitlines()[-1])
    assert check["status"] == "pass", check
    assert check["data"]["smoke"]["device"] == "cpu" and check["data"]["smoke"]["ok"]
    assert "Linear4bit forward/backward/decode on cpu match the dequantized weights" in check["seen"]
    from cockpit.doctor.model import version_at_least

    assert version_at_least(check["data"]["version"], "0.50.0")  # the qlora extra's floor


_VALUE_MODEL = """
import json, sys, yaml
import bitsandbytes as bnb
from cockpit.config import validate
from cockpit.models.resolve import resolve_model
from cockpit.train.model import build_model

cfg = validate(yaml.safe_load(open(sys.argv[1])))
model = build_model(cfg, resolve_model(cfg.model_name_or_path, log=lambda *_: None), True, 0, value_head=True)
print(json.dumps({
    "quantized": sum(isinstance(m, bnb.nn.Linear4bit) for m in model.modules()),
    "trainable": sorted({"score" if ".score." in n else "lora" if "lora_" in n else n
                         for n, p in model.named_parameters() if p.requires_grad}),
}))
"""


@pytest.mark.slow
def test_stage_rm_trains_a_value_model_over_a_4bit_base(tmp_path, tiny_model_dir, bnb_env):
    """QLoRA for the reward stage (LLaMA-Factory's rm takes quantization_bit as its other stages do):
    the value model's linears are NF4, the adapter and the value head train, and a run finishes with
    the head saved beside the adapter."""
    cfg = qlora_config(tmp_path, tiny_model_dir, 4, "rm-q4", stage="rm", dataset="cockpit_identity_pairs", max_steps=2,
                       save_steps=10, template=None)
    res = subprocess.run([sys.executable, "-c", _VALUE_MODEL, str(cfg)], env={**os.environ, **bnb_env}, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    built = json.loads(res.stdout.strip().splitlines()[-1])
    assert built["quantized"] >= 7 and built["trainable"] == ["lora", "score"]  # the adapter and the head alone
    run = train(tmp_path, cfg, bnb_env)
    saved = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert saved["task_type"] == "SEQ_CLS" and "score" in (saved.get("modules_to_save") or [])
    assert len([e for e in read_events(run) if e["kind"] == "step"]) == 2
