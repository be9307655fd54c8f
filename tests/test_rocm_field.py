"""The ROCm field guide (docs/rocm.md, issue 65) and ``cockpit doctor CONFIG`` (issue 62, item 6).

Every rule runs on faked facts: a fake ROCm tree, sysfs (KFD topology, DRM cards), /proc/cmdline, the
environment, package versions (a fake bitsandbytes), TorchFacts for GPUs this machine does not have,
and step figures for the Live alerts. One test runs the doctor on this real CPU box: nothing applies.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from cockpit.config.run_config import RunConfig
from cockpit.doctor import FAIL, PASS, SKIP, WARN, run_checks
from cockpit.doctor import field as guide
from cockpit.preflight.rocm import Facts, field_problems
from tests.test_doctor import MI300X, build_machine, by_id, cpu_facts, fake_bnb, rocm_facts, run, site, write  # noqa: F401 (site: a fixture)


@pytest.fixture
def machine(tmp_path: Path) -> dict:
    return build_machine(tmp_path)

ROOT = Path(__file__).resolve().parents[1]
FIELD = list(guide.FIELD_IDS)


# -- issue 62, item 6: cockpit doctor CONFIG, fixes as ROCm commands ---------------------------------
def test_torch_fix_is_the_rocm_index_of_the_installed_rocm_and_the_container(machine, tmp_path):
    """The torch check's fix names the PyTorch index of the ROCm install's version (read from its
    .info/version) and AMD's container; without a ROCm install, the index still, not the install page."""
    cpu = by_id(run_checks(env=machine["env"], roots=machine["roots"], facts=cpu_facts(), only=["torch"]))["torch"]
    assert "pip install torch --index-url https://download.pytorch.org/whl/rocm6.3" in cpu.fix
    assert "rocm/pytorch" in cpu.fix and ".info/version" in cpu.fix
    cuda_on_amd = rocm_facts(tmp_path, hip=None, cuda="12.6", version="2.7.1+cu126")
    wrong = run(machine, cuda_on_amd, only=["torch"])["torch"]
    assert "whl/rocm6.3" in wrong.fix and "rocm/pytorch" in wrong.fix
    write(machine["rocm"] / ".info" / "version", "7.0.1-12\n")
    assert "whl/rocm7.0" in run(machine, cpu_facts(), only=["torch"])["torch"].fix
    bare = run_checks(env={"PATH": ""}, roots={"rocm": tmp_path / "none"}, facts=cpu_facts(), only=["torch"])[0]
    assert "--index-url https://download.pytorch.org/whl/rocm" in bare.fix and "get-started" not in bare.fix


def test_doctor_config_derives_what_it_needs(machine, monkeypatch, capsys):
    """`cockpit doctor CONFIG`: a QLoRA GPU preset makes the torch check fail on a CPU-only torch (exit
    1) and lists its needs; a package its keys import that is missing fails with the install command;
    a CPU config needs nothing more."""
    import cockpit.doctor as doctor
    from cockpit.commands import doctor as doctor_cmd

    real = doctor.run_checks
    only = ["torch", "config", *FIELD]  # the rest (DeepSpeed's import, bitsandbytes' kernels) is test_doctor's
    monkeypatch.setattr(doctor, "run_checks", lambda **kw: real(facts=cpu_facts(), roots=machine["roots"], env=machine["env"], only=only, **kw))

    def doctor_json(config: str) -> tuple[int, dict]:
        ns = argparse.Namespace(config=str(ROOT / "presets" / config), overrides=[], json=True, gpu_smoke=False, needs=[])
        code = doctor_cmd.run(ns)
        return code, {d["id"]: d for d in json.loads(capsys.readouterr().out)}

    code, qlora = doctor_json("mi250-qlora-70b.yaml")
    assert code == 1 and qlora["torch"]["status"] == FAIL and "whl/rocm6.3" in qlora["torch"]["fix"]
    assert {"gpu", "qlora"} <= set(qlora["config"]["data"]["tags"])
    assert qlora["config"]["status"] == FAIL and "bitsandbytes" in qlora["config"]["fix"]  # the fake box has no side folder
    assert "pip install 'cockpit-tune[qlora]'" in qlora["config"]["fix"]
    assert set(FIELD) <= set(qlora)  # the JSON carries every field-guide item
    code, cpu = doctor_json("cpu-demo.yaml")
    assert cpu["config"]["status"] == PASS and cpu["torch"]["status"] == WARN and "gpu" not in cpu["config"]["data"]["tags"]
    (no_config,) = real(env=machine["env"], roots=machine["roots"], facts=cpu_facts(), only=["config"])
    assert no_config.status == SKIP


# -- the CPU box: every item not applicable ----------------------------------------------------------
def test_every_field_item_is_not_applicable_on_this_cpu_box(tmp_path):
    """This machine (CPU-only torch, no AMD GPU, no mask variables): each item says "not applicable",
    in the JSON too (item number, source, the guide); no warning, no failure."""
    import os

    from cockpit.doctor.facts import torch_facts

    facts = torch_facts()
    if facts.build != "cpu":
        pytest.skip("needs this CPU-only machine")
    env = {k: v for k, v in os.environ.items() if k not in guide.MASK_VARS + guide.ALLOC_VARS}
    checks = by_id(run_checks(env=env, facts=facts, only=FIELD))
    assert list(checks) == FIELD
    for c in checks.values():
        d = c.to_dict()
        assert d["status"] == SKIP and d["seen"].startswith("not applicable"), d
        assert d["data"]["doc"] == "docs/rocm.md" and d["data"]["source"] and d["data"]["item"] in range(1, 11)


# -- 1. iommu ----------------------------------------------------------------------------------------
def test_iommu_missing_on_an_amd_gpu_host(machine, tmp_path):
    proc = machine["proc"]
    write(proc / "cpuinfo", "vendor_id\t: AuthenticAMD\n")
    write(proc / "cmdline", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet\n")
    c = run(machine, rocm_facts(tmp_path), only=["iommu"])["iommu"]
    assert c.status == WARN and c.data["missing"] == ["iommu=pt"]
    assert '"iommu=pt amd_iommu=on"' in c.fix and "GRUB_CMDLINE_LINUX" in c.fix
    assert "rccl#1026" in c.fix and "docs/rocm.md item 1" in c.fix
    write(proc / "cmdline", "BOOT_IMAGE=/vmlinuz ro iommu=pt\n")
    assert run(machine, rocm_facts(tmp_path), only=["iommu"])["iommu"].status == PASS


# -- 2. allocator settings ---------------------------------------------------------------------------
def test_alloc_conf_doctor_and_check(machine, tmp_path):
    bad = {"PYTORCH_HIP_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"}
    c = run(machine, rocm_facts(tmp_path), bad, only=["alloc_conf"])["alloc_conf"]
    assert c.status == WARN and "PYTORCH_HIP_ALLOC_CONF" in c.seen and "pytorch/pytorch#123548" in c.fix
    assert run(machine, rocm_facts(tmp_path), bad, only=["alloc_conf"], needs={"gpu"})["alloc_conf"].status == FAIL
    ok = {"PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True"}
    assert run(machine, rocm_facts(tmp_path), ok, only=["alloc_conf"])["alloc_conf"].status == PASS
    # cockpit check: refused on a GPU build, from the config's env (key env) or the environment (no key)
    cfg = RunConfig(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:512"})
    (p,) = field_problems(cfg, Facts("cuda", env=dict(cfg.env or {})))
    assert p.key == "env" and "expandable_segments" in p.message
    (p,) = field_problems(RunConfig(), Facts("rocm", env=bad))
    assert p.key is None and "PYTORCH_HIP_ALLOC_CONF" in p.message
    assert field_problems(RunConfig(), Facts("cpu", env=bad)) == []
    assert field_problems(RunConfig(use_cpu=True), Facts("rocm", env=bad)) == []


# -- 3. 4-bit on CDNA --------------------------------------------------------------------------------
def test_qlora_on_cdna_needs_a_recent_bitsandbytes():
    cfg = RunConfig(quantization_bit=4)
    (p,) = field_problems(cfg, Facts("rocm", targets=["gfx942"], bnb_version="0.48.2"))
    assert p.key == "quantization_bit" and "0.48.2" in p.message and "bitsandbytes>=0.50.0" in p.message
    assert "bitsandbytes#1887" in p.message
    assert field_problems(cfg, Facts("rocm", targets=["gfx942"], bnb_version="0.50.0")) == []
    assert field_problems(cfg, Facts("rocm", targets=["gfx1100"], bnb_version="0.48.2")) == []  # RDNA: warp 32
    assert field_problems(RunConfig(quantization_bit=8), Facts("rocm", targets=["gfx90a"], bnb_version="0.48.2")) == []


def test_qlora_cdna_doctor_check(machine, site, tmp_path):
    """The doctor's item 3 on an MI300X: an old bitsandbytes warns (fails for a QLoRA config), a recent one passes."""
    facts = rocm_facts(tmp_path, kinds=(MI300X,))
    fake_bnb(site, "0.49.2")
    c = run(machine, facts, only=["qlora_cdna"])["qlora_cdna"]
    assert c.status == WARN and "0.49.2" in c.seen and "gfx942" in c.seen and "bitsandbytes>=0.50.0" in c.fix
    assert run(machine, facts, only=["qlora_cdna"], needs={"qlora"})["qlora_cdna"].status == FAIL
    fake_bnb(site, "0.50.0")
    for name in [m for m in __import__("sys").modules if m.startswith("bitsandbytes")]:
        del __import__("sys").modules[name]
    import shutil

    shutil.rmtree(site / "bitsandbytes-0.49.2.dist-info")
    assert run(machine, facts, only=["qlora_cdna"])["qlora_cdna"].status == PASS


def test_kfd_topology_gives_the_targets(tmp_path):
    nodes = tmp_path / "class" / "kfd" / "kfd" / "topology" / "nodes"
    write(nodes / "0" / "properties", "cpu_cores_count 64\ngfx_target_version 0\n")
    write(nodes / "1" / "properties", "simd_count 1216\ngfx_target_version 90402\n")
    write(nodes / "2" / "properties", "gfx_target_version 90010\n")
    write(nodes / "3" / "properties", "gfx_target_version 90500\n")
    assert guide.kfd_targets(tmp_path) == ["gfx942", "gfx90a", "gfx950"]
    assert guide.kfd_targets(tmp_path / "absent") == []


# -- 4. CUDA graphs under torch.compile ---------------------------------------------------------------
def test_compile_cudagraphs_refused_on_rocm_only(machine, tmp_path):
    cfg = RunConfig(torch_compile=True, env={"TORCHINDUCTOR_CUDAGRAPHS": "1"})
    env = dict(cfg.env or {})
    (p,) = field_problems(cfg, Facts("rocm", env=env))
    assert p.key == "torch_compile" and "pytorch/pytorch#187715" in p.message and "default mode" in p.message
    assert field_problems(cfg, Facts("cuda", env=env)) == []  # CUDA keeps it
    assert field_problems(cfg.replace(torch_compile=False), Facts("rocm", env=env)) == []
    c = run(machine, rocm_facts(tmp_path), env, only=["compile_mode"])["compile_mode"]
    assert c.status == WARN and "TORCHINDUCTOR_CUDAGRAPHS" in c.fix


def test_compile_modes_with_cuda_graphs_refused_on_rocm_only(machine, tmp_path):
    """torch_compile_mode reduce-overhead / max-autotune turn inductor's CUDA graphs on: refused on a ROCm
    build by key, with the modes that do not as the fix; the CPU and CUDA keep them; the others pass."""
    from cockpit.config.load import validate

    for mode in guide.CUDAGRAPH_MODES:
        cfg = RunConfig(torch_compile=True, torch_compile_mode=mode)
        (p,) = field_problems(cfg, Facts("rocm", env={}))
        assert p.key == "torch_compile_mode" and f"torch_compile_mode {mode}" in p.message
        assert "pytorch/pytorch#187715" in p.message and "torch_compile_mode: default" in p.message
        assert "max-autotune-no-cudagraphs" in p.message
        assert field_problems(cfg, Facts("cuda", env={})) == field_problems(cfg, Facts("cpu", env={})) == []
        assert field_problems(cfg.replace(use_cpu=True), Facts("rocm", env={})) == []
        keys = validate({"dataset": "x", "torch_compile": True, "torch_compile_mode": mode})
        c = run(machine, rocm_facts(tmp_path), {}, only=["compile_mode"], keys=keys.keys_only())["compile_mode"]
        assert c.status != PASS and "torch_compile_mode: default" in c.fix, c
    for mode in ("default", "max-autotune-no-cudagraphs"):
        assert field_problems(RunConfig(torch_compile=True, torch_compile_mode=mode), Facts("rocm", env={})) == []


# -- 5. device masks ---------------------------------------------------------------------------------
def test_device_masks_contradiction(machine, tmp_path):
    both = {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "2,3"}
    c = run(machine, rocm_facts(tmp_path), both, only=["device_masks"])["device_masks"]
    assert c.status == WARN and "ROCR_VISIBLE_DEVICES masks first" in c.seen and "ray#53737" in c.fix
    same = {"ROCR_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1"}
    ok = run(machine, rocm_facts(tmp_path), same, only=["device_masks"])["device_masks"]
    assert ok.status == PASS and "ROCR_VISIBLE_DEVICES masks first, then HIP_VISIBLE_DEVICES indexes" in ok.seen
    (p,) = field_problems(RunConfig(), Facts("rocm", env={"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}))
    assert "HIP_VISIBLE_DEVICES='0' and CUDA_VISIBLE_DEVICES='1' differ" in p.message
    assert field_problems(RunConfig(), Facts("rocm", env=same)) == []
    cfg = RunConfig(env={"ROCR_VISIBLE_DEVICES": "4"})
    (p,) = field_problems(cfg, Facts("rocm", env={"HIP_VISIBLE_DEVICES": "0,1", "ROCR_VISIBLE_DEVICES": "4"}))
    assert p.key == "env"


# -- 8. GRPO + vLLM colocated ------------------------------------------------------------------------
def test_grpo_vllm_colocate_refused_on_rocm(machine, tmp_path):
    cfg = RunConfig(stage="grpo", use_vllm=True)
    (p,) = field_problems(cfg, Facts("rocm"))
    assert p.key == "vllm_mode" and "huggingface/open-r1#482" in p.message and "vllm_mode: server" in p.message
    assert field_problems(cfg.replace(vllm_mode="server"), Facts("rocm")) == []
    assert field_problems(cfg, Facts("cuda")) == []
    keys = cfg.keys_only()
    (c,) = run_checks(env=machine["env"], roots=machine["roots"], facts=rocm_facts(tmp_path), only=["vllm_colocate"], keys=keys)
    assert c.status == WARN and "open-r1#482" in c.fix


# -- 9. fa2 where CK has no kernels -------------------------------------------------------------------
def test_fa2_refused_on_a_target_ck_does_not_build_for():
    cfg = RunConfig(flash_attn="fa2")
    (p,) = field_problems(cfg, Facts("rocm", targets=["gfx1100"], flash_attn=True))
    assert p.key == "flash_attn" and "FLASH_ATTENTION_TRITON_AMD_ENABLE=TRUE" in p.message
    triton = {"FLASH_ATTENTION_TRITON_AMD_ENABLE": "TRUE"}
    assert field_problems(cfg, Facts("rocm", targets=["gfx1100"], flash_attn=True, env=triton)) == []
    assert field_problems(cfg, Facts("rocm", targets=["gfx942", "gfx90a"], flash_attn=True)) == []


def test_cockpit_check_asks_the_field_rules_before_any_run(monkeypatch):
    """The gate (`cockpit check`, train, queue add) refuses by key on a ROCm build of torch (the build is
    the installed torch's fact: faked here, this machine's is a CPU build)."""
    from cockpit.errors import InputError
    from cockpit.preflight import rocm
    from cockpit.preflight.checks import static_checks

    cfg = RunConfig(stage="grpo", use_vllm=True, env={"ROCR_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0,1"})
    if rocm.torch_build() != "rocm":
        static_checks(cfg, gpus=0)  # this box's torch: nothing to refuse
    monkeypatch.setattr(rocm, "torch_build", lambda: "rocm")
    with pytest.raises(InputError) as err:
        static_checks(cfg, gpus=0)
    keys = {p.key for p in err.value.problems}
    assert {"vllm_mode", "env"} <= keys, err.value


# -- 6 and 7: Live alerts from step timings and gradient norms -----------------------------------------
LLAMA_7B = {
    "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096,
}


def _callback_with_meter(tmp_path, monkeypatch, peak):
    """Rank 0's callback on a fake clock, metering a 7B Llama on ``peak`` (the hardware boundary: the
    device's name and CUs become a table peak; the step times are the clock's)."""
    from cockpit.plan.params import count_params, dims_of
    from cockpit.train.flops_meter import FlopsMeter
    from tests.test_throughput_warmup import callback_on_a_clock

    tmp_path.mkdir(parents=True, exist_ok=True)
    run, callback, clock = callback_on_a_clock(tmp_path, monkeypatch)
    args = argparse.Namespace(per_device_train_batch_size=1, gradient_accumulation_steps=1, num_train_epochs=1)
    state = argparse.Namespace(global_step=0, max_steps=20, num_input_tokens_seen=0, epoch=0.0)
    from transformers import TrainerControl

    control = TrainerControl()
    callback.on_train_begin(args, state, control)
    callback.meter = FlopsMeter(dims_of(LLAMA_7B), count_params(LLAMA_7B), 1.0, 0, False, peak, 1)
    return run, callback, clock, args, state, control


def _train(callback, clock, args, state, control, seconds_per_step, norms=None):
    for step in range(1, 13):
        clock["t"] += seconds_per_step
        state.global_step, state.num_input_tokens_seen = step, step * 1000
        callback.on_step_end(args, state, control)
        logs = {"loss": 1.0, "epoch": 0.1, "grad_norm": (norms or {}).get(step, 1.0)}
        callback.on_log(args, state, control, logs=logs)


def _alerts(run):
    from cockpit.store.events import read_all

    return [e for e in read_all(run.events_path) if e["kind"] == "alert"]


def test_slow_step_alert_from_step_timings_on_a_gpu_only(tmp_path, monkeypatch):
    """1000 tokens of a 7B model a step on an MI300X (table peak 1307 TFLOPS): 10 s a step is ~0.3 %
    MFU: one slow_step alert after warm-up, naming the causes and hipBLASLt's switch; 0.5 s a step is
    ~9 %: none; the same slow steps against a CPU's measured peak: none (its MFU is low by nature)."""
    from cockpit.doctor.peak import Peak, device_peak

    mi300x = device_peak("AMD Instinct MI300X", 304, "bf16")
    run, cb, clock, args, state, control = _callback_with_meter(tmp_path / "slow", monkeypatch, mi300x)
    _train(cb, clock, args, state, control, 10.0)
    (alert,) = [a for a in _alerts(run) if a["code"] == "slow_step"]
    assert alert["level"] == "warn" and "MI300X" in alert["message"] and alert["mfu"] < 0.05
    assert any("TORCH_BLAS_PREFER_HIPBLASLT=0" in r for r in alert["remedies"]) and "rocm-systems#4084" in alert["source"]
    run, cb, clock, args, state, control = _callback_with_meter(tmp_path / "fast", monkeypatch, mi300x)
    _train(cb, clock, args, state, control, 0.5)
    assert not [a for a in _alerts(run) if a["code"] == "slow_step"]
    cpu = Peak("AMD EPYC", 0.05, "measured", "fp32")
    run, cb, clock, args, state, control = _callback_with_meter(tmp_path / "cpu", monkeypatch, cpu)
    _train(cb, clock, args, state, control, 10.0)
    assert not [a for a in _alerts(run) if a["code"] == "slow_step"]


def test_early_grad_norm_alert(tmp_path, monkeypatch):
    """A gradient norm in the thousands at the first step: one alert at once; a first-steps norm 300x
    the later median (under the bound): one alert once the later norms are in; an ordinary start: none."""
    from cockpit.doctor.peak import device_peak
    from cockpit.telemetry.step_health import EarlyGradNorm

    peak = device_peak("AMD Instinct MI300X", 304, "bf16")
    run, cb, clock, args, state, control = _callback_with_meter(tmp_path / "a", monkeypatch, peak)
    _train(cb, clock, args, state, control, 0.5, norms={1: 4200.0, 2: 3900.0})
    (alert,) = [a for a in _alerts(run) if a["code"] == "early_grad_norm"]
    assert "4200 at step 1" in alert["message"] and "LlamaFactory#7890" in alert["source"]
    assert any("max_grad_norm" in r for r in alert["remedies"])
    rule = EarlyGradNorm()
    said = [rule.observe(s, n) for s, n in enumerate([300.0, 2.0, 1.5, 1.0, 1.0, 0.9, 1.1, 1.0], 1)]
    assert [i for i, a in enumerate(said, 1) if a] == [8] and "300x the later median" in said[7]["message"]
    quiet = EarlyGradNorm()
    assert not any(quiet.observe(s, n) for s, n in enumerate([8.0, 5.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, float("nan")], 1))


# -- 9. the attention backends' smoke (the GPU path of --gpu-smoke; on this CPU the same code runs) -----
def test_attention_backends_probe_runs_each_backend_alone():
    """Each SDPA backend alone, one tiny causal forward + backward against the math result: on this CPU
    the math and flash kernels run and the CUDA-only ones say why not; fa2 says it is not here."""
    import torch

    from cockpit.doctor.smoke import attention_backends, attention_words

    got = attention_backends("cpu")
    assert set(got) == {"flash_attention", "efficient_attention", "math", "cudnn_attention", "fa2"}
    assert got["math"]["ok"] and got["math"]["rel_err"] < 1e-4
    assert not got["fa2"]["ok"] and got["fa2"]["note"]
    assert all(v["ok"] or v["note"] for v in got.values())
    words = attention_words(got)
    assert "math ok" in words and "fa2 no" in words
    assert torch.get_default_dtype() == torch.float32


# -- 10. the flight recorder: the relaunch sets it, the supervisor reads its dumps, Live shows them ------
def _dump(path: Path, entries: list[dict]) -> None:
    """A dump as PyTorch's flight recorder writes it (a pickle of plain data; torch's own reader
    torch.distributed.flight_recorder.components.loader.read_dump reads these keys)."""
    import pickle

    path.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": entries}))


def _entry(seq: int, state: str, op: str = "all_reduce") -> dict:
    return {"record_id": seq, "collective_seq_id": seq, "profiling_name": f"nccl:{op}", "state": state,
            "process_group": ("0", "default_pg"), "input_sizes": [[1024]], "time_created_ns": seq}


def test_flight_recorder_from_relaunch_to_the_comm_line(tmp_path):
    """The hang relaunch's env turns the recorder on; the supervisor points the dumps into logs/; a
    timeout's dumps become the comm event's details.flight (rank 0 still in all_reduce #12, rank 1 done
    with #11: rank 1 never joined); the Comm line says so; a pickle that would build an object is refused."""
    import pickle

    import yaml
    from rich.console import Console

    from cockpit.comm.flight import flight_env, read_dumps
    from cockpit.config import default_config
    from cockpit.run.supervisor import Supervisor
    from cockpit.run.watchdog import DEBUG_ENV
    from cockpit.store.rundir import create_run_dir
    from cockpit.ui import formatting
    from cockpit.ui.state import RunState
    from conftest import read_events

    assert DEBUG_ENV["TORCH_NCCL_TRACE_BUFFER_SIZE"] != "0" and DEBUG_ENV["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    logs = tmp_path / "logs"
    assert flight_env(DEBUG_ENV, logs) == {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": f"{logs}/flight_rank_", "TORCH_FR_DUMP_TEMP_FILE": f"{logs}/flight_rank_"}
    assert flight_env({}, logs) == {} and flight_env({**DEBUG_ENV, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/x/"}, logs) == {}

    run = create_run_dir(tmp_path, "hang")
    cfg = default_config()
    cfg.update(dataset="x", nproc_per_node=2, telemetry_interval_s=0, env=dict(DEBUG_ENV))
    run.config_path.write_text(yaml.safe_dump(cfg))
    fixture = sorted((ROOT / "tests" / "fixtures" / "nccl").glob("*rccl*"))[0]
    run.rank_log(0).write_text("\n".join(ln for ln in fixture.read_text().splitlines() if not ln.startswith("#")) + "\n")
    _dump(run.logs_dir / "flight_rank_0", [_entry(11, "completed"), _entry(12, "started")])
    _dump(run.logs_dir / "flight_rank_1", [_entry(10, "completed"), _entry(11, "completed")])
    sup = Supervisor(run)
    sup.follow_comm_logs()
    comm = [e for e in read_events(run.path) if e["kind"] == "comm"][-1]
    flight = comm["details"]["flight"]
    assert flight["0"]["op"] == "all_reduce" and (flight["0"]["seq"], flight["0"]["state"]) == (12, "started")
    assert (flight["1"]["seq"], flight["1"]["state"]) == (11, "completed")
    state = RunState()
    state.comm = comm
    console = Console(width=200, record=True)
    console.print(formatting.comm(state))
    shown = console.export_text()
    assert "in flight at the timeout" in shown and "r0 all_reduce #12 started · r1 all_reduce #11 completed" in shown

    class Evil:
        def __reduce__(self):
            return (print, ("built",))

    (run.logs_dir / "flight_rank_2").write_bytes(pickle.dumps({"entries": [Evil()]}))
    assert "not plain data" in read_dumps(run.logs_dir)["2"]["error"]


def test_alloc_conf_bench_is_ready_for_a_gpu():
    """bench/alloc_conf.py (item 2's measurement, run by scripts/gpu_check.sh): its settings hold the
    combination pytorch#123548 names, its child program compiles, and without a GPU it says so and exits 0."""
    import importlib.util
    import subprocess
    import sys

    spec = importlib.util.spec_from_file_location("alloc_conf", ROOT / "bench" / "alloc_conf.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert guide.alloc_conf_problem({"PYTORCH_HIP_ALLOC_CONF": bench.SETTINGS["both (pytorch#123548)"]})
    assert not any(guide.alloc_conf_problem({"PYTORCH_HIP_ALLOC_CONF": v}) for k, v in bench.SETTINGS.items() if "both" not in k)
    compile(bench.CHILD, "alloc_conf child", "exec")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "alloc_conf.py")], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": ""})
    assert out.returncode == 0 and out.stdout.startswith("alloc_conf: skipped: no GPU"), out.stderr
