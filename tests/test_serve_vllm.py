"""A real vLLM (slow tier, markers `slow` and `vllm`): vLLM's CPU build serves the embedded
SmolLM2-135M-Instruct with LoRA and runtime updating on 127.0.0.1; a tiny adapter trained on
the embedded model through `cockpit train` is hot-loaded with `cockpit serve --vllm-url`, and
the tuned answer must differ from the base one and match local generation.

Needs the separate venv made by scripts/vllm_venv.sh (.cache/vllm-venv, or $COCKPIT_VLLM_VENV);
skips with the reason when it is absent, unless COCKPIT_REQUIRE_VLLM=1 (then it fails).

Tolerance: greedy decoding on both sides, the server started with --dtype float32 like the
local model; the first MATCH_TOKENS generated tokens must be identical (different kernels may
flip a near-tie later on, so the rest is reported, not asserted).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, cockpit, write_yaml

# serial: the server and the training beside it each want both cores (about 100 s alone)
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.serial]

MATCH_TOKENS = 8
PROMPT = "Who are you?"
VENV = Path(os.environ.get("COCKPIT_VLLM_VENV") or ROOT / ".cache" / "vllm-venv")
VPY = VENV / "bin" / "python"


def _need_vllm() -> None:
    if VPY.exists() and (VENV / ".cockpit-vllm-installed").exists():
        return
    reason = f"no vLLM venv at {VENV} (make it with: bash scripts/vllm_venv.sh)"
    if os.environ.get("COCKPIT_REQUIRE_VLLM") == "1":
        pytest.fail(reason + " and COCKPIT_REQUIRE_VLLM=1")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory, embedded_dir):
    _need_vllm()
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = dict(os.environ, VLLM_ALLOW_RUNTIME_LORA_UPDATING="True", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1")
    argv = [
        str(VPY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(embedded_dir), "--host", "127.0.0.1",
        "--port", str(port), "--enable-lora", "--max-lora-rank", "8", "--max-model-len", "512", "--dtype", "float32",
    ]
    t0 = time.time()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = {"url": f"http://127.0.0.1:{port}", "proc": proc, "log": log, "t0": t0}
    try:
        yield server
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _wait_ready(server, timeout: float = 900) -> float:
    from cockpit.serve.command import wait_ready

    if not server.get("ready_s"):
        ok = wait_ready(server["url"], timeout, pid=server["proc"].pid)
        if not ok:
            pytest.fail(f"vLLM did not start within {timeout:.0f}s:\n" + server["log"].read_text(errors="replace")[-3000:])
        server["ready_s"] = time.time() - server["t0"]
    return server["ready_s"]


@pytest.fixture(scope="module")
def embedded_run(tmp_path_factory, vllm_server) -> Path:
    """A LoRA (rank 8) trained for a few steps on the embedded model, while vLLM starts."""
    tmp = tmp_path_factory.mktemp("emb-run")
    cfg = write_yaml(tmp / "emb.yaml", {
        "model_name_or_path": "smollm2-135m-instruct",
        "dataset": "cockpit_identity",
        "finetuning_type": "lora",
        "lora_rank": 8,
        "lora_target": "all",
        "cutoff_len": 96,
        "per_device_train_batch_size": 4,
        "learning_rate": 2e-3,
        "max_steps": 8,
        "logging_steps": 1,
        "save_steps": 1000,
        "use_cpu": True,
        "telemetry_interval_s": 2.0,
    })
    t0 = time.time()
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp / "runs"), timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    run = next(d for d in (tmp / "runs").iterdir() if d.is_dir())
    (run / "train_seconds").write_text(f"{time.time() - t0:.1f}")
    return run


def _local_greedy(run: Path, embedded_dir: Path, n: int) -> dict[str, list[int]]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cockpit.data.render import render_prompt_ids

    tok = AutoTokenizer.from_pretrained(str(run / "adapter"))
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(embedded_dir), dtype=torch.float32), str(run / "adapter")).eval()
    ids = torch.tensor([render_prompt_ids(tok, [{"role": "user", "content": PROMPT}])])
    out = {}
    with torch.no_grad():
        for side in ("base", "tuned"):
            if side == "base":
                with model.disable_adapter():
                    g = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
            else:
                g = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False)
            new = g[0, ids.shape[1]:].tolist()
            out[side] = new[:-1] if new and new[-1] == tok.eos_token_id else new
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def test_hot_load_into_real_vllm_matches_local(vllm_server, embedded_run, embedded_dir):
    ready_s = _wait_ready(vllm_server)
    n = 16
    t0 = time.time()
    res = cockpit("serve", embedded_run.name, "--runs-dir", str(embedded_run.parent), "--vllm-url", vllm_server["url"],
                  "--name", "kestrel", "--prompt", PROMPT, "--max-tokens", str(n), "--json", timeout=600)
    serve_s = time.time() - t0
    assert res.returncode == 0, res.stdout + res.stderr
    rec = json.loads(res.stdout)
    probe = rec["probe"]
    assert probe["tuned"] != probe["base"], probe
    local = _local_greedy(embedded_run, embedded_dir, n)
    match = {s: _common_prefix(probe[f"{s}_token_ids"], local[s]) for s in ("base", "tuned")}
    print(f"\n[vllm] server ready {ready_s:.0f}s, train {(embedded_run / 'train_seconds').read_text()}s, serve+probe {serve_s:.1f}s, "
          f"matching tokens of {n}: {match}\n[vllm] base: {probe['base']!r}\n[vllm] tuned: {probe['tuned']!r}")
    for side in ("base", "tuned"):
        assert match[side] >= min(MATCH_TOKENS, len(local[side])), (side, probe[f"{side}_token_ids"], local[side])
    # the same adapter through `cockpit chat --vllm-url` (streaming): the same greedy answer
    chat = cockpit("chat", embedded_run.name, "--runs-dir", str(embedded_run.parent), "--vllm-url", vllm_server["url"],
                   "--prompt", PROMPT, "--max-new-tokens", str(n), "--json", timeout=600)
    assert chat.returncode == 0, chat.stderr
    got = json.loads(chat.stdout)["results"][0]
    assert got["tuned"].strip() == probe["tuned"].strip() and got["base"].strip() == probe["base"].strip()
