"""Issue 34's hardening that a CPU shows: an export folder others can read (a vLLM server of another
user), secrets never written down (run dir, UI configs, stdout), secret names beyond TOKEN/KEY."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from cockpit.store.rundir import create_run_dir


def test_an_export_folder_has_an_ordinary_folders_mode(tmp_path):
    from cockpit.serve.export import export_run

    run = create_run_dir(tmp_path / "runs", "exp")
    adapter = run.path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}))
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    (run.path / "config.yaml").write_text("model_name_or_path: smollm2-135m-instruct\nfinetuning_type: lora\n")
    (run.path / "summary.json").write_text(json.dumps({"adapter_dir": str(adapter)}))
    old = os.umask(0o022)
    try:
        record = export_run(run, out=tmp_path / "shared" / "my-adapter", log=lambda *_: None)
    finally:
        os.umask(old)
    out = Path(record["path"])
    assert stat.S_IMODE(out.stat().st_mode) == 0o755  # not mkdtemp's 0700
    assert (out / "adapter_config.json").exists()


def test_secret_names_beyond_token_and_key():
    from cockpit.redact import is_secret_name, redact_env, secret_values

    for name in (
        "DB_PASS",
        "SMTP_PASSWORD",
        "LDAP_PASSWD",
        "PROXY_AUTH",
        "BASIC_AUTH_HEADER",
        "HF_TOKEN",
        "WANDB_API_KEY",
    ):
        assert is_secret_name(name), name
    for name in ("HIP_VISIBLE_DEVICES", "NCCL_DEBUG", "OMP_NUM_THREADS"):
        assert not is_secret_name(name), name
    env = {"DB_PASS": "x1", "NCCL_DEBUG": "INFO", "HF_TOKEN": "***redacted***"}
    assert redact_env(env) == {"DB_PASS": "***redacted***", "NCCL_DEBUG": "INFO", "HF_TOKEN": "***redacted***"}
    assert secret_values(env) == {"DB_PASS": "x1"}


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


def _hits(folder: Path, planted: list[str]) -> list[str]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {s}" for s in planted if s.encode() in data]
    return found


@pytest.mark.slow
def test_planted_secrets_reach_the_run_and_are_written_nowhere(tmp_path, tiny_model_dir):
    """Issue 34: the UI's launch (a config written by cli_calls.write_config, the secrets through the
    command's environment), then `cockpit resume --set env=...`: the supervisor has every secret, and
    the run dir, the UI's config folder and the commands' output hold none of them."""
    from conftest import cockpit, has_step, tiny_config, wait_for

    from cockpit.config.load import read_yaml
    from cockpit.ui import cli_calls

    planted = ["planted-pass-81b7", "planted-auth-3c2e", "planted-token-9f04"]
    runs = tmp_path / "runs"
    cfg, _ = read_yaml(tiny_config(tmp_path, tiny_model_dir, max_steps=400, save_steps=2))
    cfg["env"] = {"DB_PASS": planted[0], "PROXY_AUTH": planted[1], "NCCL_DEBUG": "WARN"}
    ui_configs = runs / ".ui-configs"
    ui_configs.mkdir(parents=True)
    path = ui_configs / "launch.yaml"
    secrets = cli_calls.write_config(path, cfg)
    assert secrets == {"DB_PASS": planted[0], "PROXY_AUTH": planted[1]}
    res = cli_calls.train_detached(path, runs, secrets=secrets)
    assert res.rc == 0, res.error_text
    run = Path(res.data["run_dir"])
    status = lambda: json.loads((run / "status.json").read_text())  # noqa: E731
    try:
        wait_for(lambda: has_step(run, 2), 180, "steps")
        env = _environ(status()["supervisor_pid"])
        assert (
            env.get("DB_PASS") == planted[0] and env.get("PROXY_AUTH") == planted[1] and env.get("NCCL_DEBUG") == "WARN"
        )
        assert cockpit("stop", str(run), "--wait", "120").returncode == 0
        resumed = cockpit("resume", str(run), "--set", f"env={{API_TOKEN: {planted[2]}}}", "--detach")
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        wait_for(
            lambda: status().get("supervisor_pid") and status().get("state") in ("running", "starting"), 60, "attempt 2"
        )
        env = _environ(status()["supervisor_pid"])
        assert env.get("API_TOKEN") == planted[2]
        outputs = res.stdout + res.stderr + resumed.stdout + resumed.stderr
        assert not [s for s in planted if s in outputs]
    finally:
        cockpit("stop", str(run), "--kill", "--wait", "60")
    assert not _hits(run, planted) and not _hits(ui_configs, planted), _hits(run, planted) + _hits(ui_configs, planted)


def test_fp16_lora_trains_every_trainable_parameter_in_fp32(tmp_path, tiny_model_dir):
    """Issue 34: LoRA over an fp16 base (a GPU run) keeps modules_to_save copies in fp16 unless cast,
    which HF's GradScaler refuses on a GPU. The decision is pure; the cast runs here on CPU tensors."""
    import torch
    from conftest import tiny_config
    from transformers import AutoModelForCausalLM

    from cockpit.config.load import load_config
    from cockpit.train.model import trainable_in_fp32, upcast_trainable, with_lora_adapter

    cfg = load_config(str(tiny_config(tmp_path, tiny_model_dir)), ["additional_target=norm"])
    assert not trainable_in_fp32(cfg)  # fp32: nothing to cast
    assert trainable_in_fp32(cfg.replace(fp16=True)) and trainable_in_fp32(cfg.replace(bf16=True))
    assert not trainable_in_fp32(cfg.replace(fp16=True, use_badam=True))
    assert not trainable_in_fp32(cfg.replace(fp16=True, finetuning_type="full"))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float16)
    model = with_lora_adapter(base, cfg.replace(fp16=True))
    half_trainable = [n for n, p in model.named_parameters() if p.requires_grad and p.dtype == torch.float16]
    assert any("modules_to_save" in n for n in half_trainable), half_trainable  # the defect, before the cast
    assert upcast_trainable(model) == len(half_trainable)
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert all(
        p.dtype == torch.float16 for n, p in model.named_parameters() if not p.requires_grad and "lora_" not in n
    )


@pytest.mark.gpu
def test_fp16_lora_step_on_a_gpu(tmp_path, tiny_model_dir):
    """The GPU twin: one fp16 LoRA step with modules_to_save through HF's GradScaler (CI: skipped)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU here")
    from conftest import cockpit, tiny_config

    cfg = tiny_config(tmp_path, tiny_model_dir, fp16=True, use_cpu=False, max_steps=2, additional_target="norm")
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"))
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_half_base_with_fp32_copies_generates_as_it_trained(tmp_path, tiny_model_dir):
    """A bf16 base whose trainable copies were upcast for training (an ``additional_target`` norm in
    fp32) generates under bf16 autocast: outside it the norm's fp32 output met a bf16 linear (found on
    the first GPU run, the probes after training). One-dtype models generate without autocast."""
    import torch
    from conftest import tiny_config
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cockpit.config.load import load_config
    from cockpit.train.generation import generate_new_tokens, mixed_half_dtype
    from cockpit.train.model import upcast_trainable, with_lora_adapter

    cfg = load_config(str(tiny_config(tmp_path, tiny_model_dir)), ["additional_target=norm", "bf16=true"])
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16)
    assert mixed_half_dtype(base) is None
    model = with_lora_adapter(base, cfg)
    upcast_trainable(model)
    assert mixed_half_dtype(model) is torch.bfloat16
    with pytest.raises(RuntimeError, match="dtype"):  # the defect: generating outside autocast
        with torch.no_grad():
            model(input_ids=torch.tensor([[1, 2, 3]]))
    answers = generate_new_tokens(model, tok, [[1, 2, 3], [4, 5]], max_new_tokens=3, do_sample=False)
    assert [len(a) for a in answers] == [3, 3]
    assert model.training  # the training mode comes back after generating in eval
    fp32 = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    assert mixed_half_dtype(with_lora_adapter(fp32, load_config(str(tiny_config(tmp_path, tiny_model_dir))))) is None


@pytest.mark.slow
def test_a_bf16_run_with_additional_target_answers_its_probes_after_training(tmp_path, tiny_model_dir):
    """The whole path on the CPU: a bf16 LoRA run with ``additional_target: norm`` trains, then asks
    its probes (it failed there on the first GPU run, fp16 and bf16 alike)."""
    from conftest import cockpit, read_events, tiny_config

    cfg = tiny_config(tmp_path, tiny_model_dir, bf16=True, max_steps=2, save_steps=2, additional_target="norm")
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    events = read_events(next((tmp_path / "runs").iterdir()))
    after = [e for e in events if e["kind"] == "probe_results" and e.get("phase") == "after"]
    assert after and after[-1]["results"] and all(r["answer"] is not None for r in after[-1]["results"]), after


def _scaled_optimizer():
    """A real accelerate optimizer wrapper over torch's GradScaler (what HF's Trainer steps under fp16;
    torch's CPU scaler here) and its parameter."""
    torch = pytest.importorskip("torch")
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    Accelerator(cpu=True)
    param = torch.nn.Parameter(torch.ones(2))
    scaler = torch.amp.GradScaler("cpu")
    return AcceleratedOptimizer(torch.optim.SGD([param], lr=0.1), device_placement=False, scaler=scaler), param, scaler


def test_a_step_the_fp16_loss_scaler_skipped_is_no_nan(tmp_path):
    """fp16's loss scaler skips an update whose gradients overflow and halves its scale: the weights are
    unchanged, so the run goes on (one info alert), the checkpoint record stays finite; 20 skipped
    logging steps in a row are a NaN by the NaN rule. A real accelerate optimizer over a real
    GradScaler says which step it skipped (found on the first GPU run: every fp16 run's first overflow
    stopped it as a NaN)."""
    from types import SimpleNamespace

    from transformers import TrainerControl

    from cockpit.config.run_config import RunConfig
    from cockpit.store.events import EventWriter, read_all
    from cockpit.store.rundir import RunDir
    from cockpit.train import callbacks as cb
    from cockpit.train.trainer import finite_step

    optimizer, param, scaler = _scaled_optimizer()
    scaler.scale(param.sum()).backward()
    optimizer.step()
    assert not cb.scaler_skipped(optimizer)
    optimizer.zero_grad()
    scaler.scale(param.sum()).backward()
    param.grad[0] = float("inf")
    before = param.detach().clone()
    optimizer.step()
    assert cb.scaler_skipped(optimizer) and (param.detach() == before).all() and scaler.get_scale() == 32768.0
    assert not cb.scaler_skipped(None) and not cb.scaler_skipped(SimpleNamespace())

    run = RunDir(tmp_path)
    callback = cb.CockpitCallback(
        run, RunConfig(nan_policy="stop", spike_policy="warn", spike_factor=3.0), 0, 1, EventWriter(run.events_path)
    )
    callback._gather_memory = lambda: {}
    callback._check_memory = lambda *a: None
    callback.update_skipped = lambda: cb.scaler_skipped(optimizer)  # as recipes.base.train sets it
    args = SimpleNamespace(per_device_train_batch_size=1, gradient_accumulation_steps=1, num_train_epochs=1)
    state = SimpleNamespace(global_step=0, max_steps=40, num_input_tokens_seen=0, epoch=0.0)
    control = TrainerControl()  # HF's own: every flag a callback reads
    callback.on_train_begin(args, state, control)
    for step in range(1, 4):
        state.global_step = step
        callback.on_log(args, state, control, logs={"loss": 2.0, "grad_norm": float("inf")})
    alerts = [e for e in read_all(run.events_path) if e["kind"] == "alert"]
    assert [a["code"] for a in alerts] == ["loss_scale_overflow"] and not control.should_training_stop, alerts
    assert not callback.nan_seen
    for step in range(4, 4 + cb.SKIPPED_STEPS_LIMIT):
        state.global_step = step
        callback.on_log(args, state, control, logs={"loss": 2.0, "grad_norm": float("inf")})
    assert callback.nan_seen and control.should_training_stop  # no scale gave finite gradients
    plain = cb.CockpitCallback(run, RunConfig(nan_policy="stop", spike_policy="warn", spike_factor=3.0), 0, 1, None)
    plain._gather_memory = lambda: {}
    plain._check_memory = lambda *a: None
    stop = TrainerControl()  # HF's own: every flag a callback reads
    plain.on_train_begin(args, state, stop)
    plain.on_log(args, state, stop, logs={"loss": 2.0, "grad_norm": float("inf")})
    assert plain.nan_seen and stop.should_training_stop  # no scaler skipped it: a NaN, as before

    # the checkpoint record (CockpitTrainer.loss_finite): a skipped update left finite weights
    assert finite_step(2.0, float("inf"), optimizer) and not finite_step(float("nan"), 1.0, optimizer)
    assert not finite_step(2.0, float("inf"), SimpleNamespace())


def test_a_missing_prerequisite_fails_under_ci_and_skips_elsewhere(monkeypatch):
    """Issue 34: the chaos, disk-full, Slurm, tmux and numactl tests skip without their prerequisite
    on a developer's machine; in CI (CI=true), which installs them all, they fail instead."""
    from conftest import prerequisite

    prerequisite(True, "present")  # nothing happens
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="missing prerequisite in CI"):
        prerequisite(False, "tmux not installed")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="tmux not installed"):
        prerequisite(False, "tmux not installed")


class _HungBackend:
    """A GPU library whose calls never return (a driver in a GPU hang)."""

    name = "amdsmi"

    def __init__(self) -> None:
        import threading

        self.release = threading.Event()

    def devices(self):
        self.release.wait()
        return []

    def close(self) -> None:
        raise AssertionError("a hung library is not shut down (the call would wait too)")


def test_a_hung_gpu_library_never_blocks_a_sample():
    """Issue 34: the supervisor samples the GPU library in a collector thread with a deadline."""
    import time

    from cockpit.telemetry import Sampler

    backend = _HungBackend()
    sampler = Sampler({}, interval_s=0.05, backend=backend, unavailable={}, threaded=True, deadline_s=0.3)
    try:
        t0 = time.monotonic()
        first = sampler.sample()
        assert time.monotonic() - t0 < 0.2 and first["devices"] == [] and "amdsmi" not in first["unavailable"]
        time.sleep(0.5)
        t0 = time.monotonic()
        late = sampler.sample()
        assert time.monotonic() - t0 < 0.2
        assert "has not returned" in late["unavailable"]["amdsmi"], late
        sampler.close()  # returns: the library is left alone while its call hangs
    finally:
        backend.release.set()


@pytest.mark.slow
def test_stop_works_while_the_gpu_library_hangs(tmp_path, tiny_model_dir):
    """A run whose supervisor's GPU library hangs on every VRAM query (COCKPIT_FAKE_GPUS=amdsmi:1:hang):
    telemetry says the backend is failing, steps are followed, and `cockpit stop` ends the run."""
    from conftest import cockpit, has_step, read_events, start_detached, tiny_config, wait_for

    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=400, telemetry_interval_s=0.5)
    run = start_detached(tmp_path, cfg, env={"COCKPIT_FAKE_GPUS": "amdsmi:1:hang"})
    try:
        wait_for(lambda: has_step(run, 2), 180, "steps while the library hangs")
        failing = lambda: [
            e
            for e in read_events(run)
            if e["kind"] == "telemetry"  # noqa: E731
            and "has not returned" in str((e.get("unavailable") or {}).get("amdsmi"))
        ]
        wait_for(failing, 60, "telemetry saying the library hangs")
        res = cockpit("stop", str(run), "--wait", "120")
        assert res.returncode == 0 and "stopped" in res.stdout, res.stdout + res.stderr
    finally:
        cockpit("stop", str(run), "--kill", "--wait", "60")


# -- per-step host synchronisation: the stop / save flags -------------------------------------------
def _flags_rank(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from cockpit.train.callbacks import agreed_flags, control_group

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    group = control_group(dist)
    mine = [rank == 1, False]  # rank 1 alone has a stop request
    got = agreed_flags(dist, mine, group)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"group": group is None, "flags": got}))
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_stop_one_rank_sees_reaches_every_rank_over_the_host_group(tmp_path):
    """The flags' all-reduce runs on host tensors over the default gloo group on the CPU (and a gloo side
    group on NCCL / RCCL: the GPU twin below), so checking them each step never waits for a device."""
    import torch.multiprocessing as mp

    mp.start_processes(
        _flags_rank, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, start_method="spawn", join=True
    )
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {"group": True, "flags": [True, False]}, rank  # gloo already: no side group


@pytest.mark.gpu
def test_the_flags_leave_the_nccl_group_for_a_gloo_side_group_on_a_gpu(tmp_path):
    """GPU twin: under NCCL the flags travel on a gloo side group, as host tensors (CI: skipped)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no GPU here")
    import torch.distributed as dist

    from cockpit.train.callbacks import agreed_flags, control_group

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        group = control_group(dist)
        assert group is not None and dist.get_backend(group) == "gloo"
        assert agreed_flags(dist, [True, False], group) == [True, False]
    finally:
        dist.destroy_process_group()


def test_a_loss_spike_is_measured_over_a_positive_median_only(tmp_path):
    """GRPO logs a loss of exactly 0 on its first steps (and DPO's, GRPO's losses go below 0): a positive
    loss after five zeros is no spike, and the spike check divided by the zero median (a run crashed with
    ZeroDivisionError at step 10 of the GRPO demo with max_completion_length 16). A real spike over a
    positive median still warns."""
    from types import SimpleNamespace

    from transformers import TrainerControl

    from cockpit.config.run_config import RunConfig
    from cockpit.store.events import EventWriter, read_all
    from cockpit.store.rundir import RunDir
    from cockpit.train import callbacks as cb

    run = RunDir(tmp_path)
    args = SimpleNamespace(per_device_train_batch_size=1, gradient_accumulation_steps=1, num_train_epochs=1)
    grpo = [0.0, 0.0, 0.0, -0.02, 0.0, 0.1, -0.01, 0.05, 0.3]  # GRPO's: zero and negative medians, then positive
    sft = [2.0, 2.1, 1.9, 2.0, 2.0, 9.0]  # a positive median, then 4.5x it
    for losses in (grpo, sft):
        callback = cb.CockpitCallback(run, RunConfig(spike_policy="warn", spike_factor=3.0), 0, 1, EventWriter(run.events_path))
        callback._gather_memory = lambda: {}
        callback._check_memory = lambda *a: None
        state = SimpleNamespace(global_step=0, max_steps=40, num_input_tokens_seen=0, epoch=0.0)
        control = TrainerControl()
        callback.on_train_begin(args, state, control)
        for step, loss in enumerate(losses, start=1):
            state.global_step = step
            callback.on_log(args, state, control, logs={"loss": loss, "grad_norm": 1.0})
    spikes = [e for e in read_all(run.events_path) if e["kind"] == "alert" and e["code"] == "loss_spike"]
    assert [s["message"] for s in spikes] == [f"loss 9 at step {len(sft)} is 4.5x the recent median 2"], spikes
    assert not control.should_training_stop
