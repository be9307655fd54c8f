"""DeepSpeed configs: every generated one and LLaMA-Factory's own files pass DeepSpeed's parser after
HF fills "auto"; broken ones fail with our message (naming the file and key), exit 2 from the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import ROOT, cockpit, write_yaml
from cockpit.config.load import load_config
from cockpit.errors import InputError
from cockpit.strategy import deepspeed as ds

pytest.importorskip("deepspeed")
FIXTURES = ROOT / "tests" / "fixtures" / "deepspeed"


def run_cfg(**over) -> dict:
    items = [f"{k}={v}" for k, v in {"dataset": "x.json", "nproc_per_node": 2, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, **over}.items()]
    return load_config(None, items, check_paths=False).keys_only()


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("offload", ["none", "optimizer", "optimizer+params"])
@pytest.mark.parametrize("prec", ["fp32", "bf16", "fp16"])
def test_generated_configs_pass_deepspeed(stage, offload, prec):
    if offload == "optimizer+params" and stage == 2:
        pytest.skip("refused by config validation")
    cfg = run_cfg(zero_stage=stage, offload=offload, **({prec: True} if prec != "fp32" else {}))
    gen = ds.generate(cfg, use_cpu=False)
    assert gen["communication_data_type"] == prec
    assert gen["zero_optimization"]["overlap_comm"] is True and gen["zero_optimization"]["contiguous_gradients"] is True
    filled = ds.effective(gen, cfg, file="<generated>", hidden_size=64, num_training_steps=10)
    assert filled["train_batch_size"] == 2 * 2 * 2 and filled["train_micro_batch_size_per_gpu"] == 2
    assert filled["zero_optimization"]["reduce_bucket_size"] == 64 * 64
    assert filled["bf16"]["enabled"] is (prec == "bf16") and filled["fp16"]["enabled"] is (prec == "fp16")
    if stage == 3:
        assert filled["zero_optimization"]["stage3_param_persistence_threshold"] == 640
    assert ("offload_param" in filled["zero_optimization"]) is (offload == "optimizer+params")
    assert ds.generate(cfg, use_cpu=True)["zero_optimization"]["overlap_comm"] is False


@pytest.mark.parametrize("name", ["ds_z0_config.json", "ds_z2_config.json", "ds_z3_config.json", "ds_z2_offload_config.json", "ds_z3_offload_config.json"])
def test_llamafactory_files_load_and_pass(name):
    path = FIXTURES / name
    filled = ds.effective(ds.read_file(path), run_cfg(bf16=True), file=str(path), hidden_size=64, num_training_steps=10)
    assert filled["bf16"]["enabled"] is True and filled["gradient_accumulation_steps"] == 2


def test_known_top_level_keys_are_deepspeeds():
    import deepspeed

    src = "\n".join(p.read_text(errors="replace") for p in Path(deepspeed.__file__).parent.rglob("*.py"))
    missing = [k for k in sorted(ds.KNOWN_TOP_LEVEL) if not re.search(rf"[\"']{re.escape(k)}[\"']", src)]
    assert not missing


def broken(tmp_path: Path, base: str, edit) -> Path:
    data = json.loads((FIXTURES / base).read_text())
    edit(data)
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(data, indent=2))
    return p


@pytest.mark.parametrize(
    "edit, key, text",
    [
        (lambda d: d.update(zero_optimisation={"stage": 2}), "zero_optimisation", "did you mean 'zero_optimization'"),
        (lambda d: d["bf16"].update(enabled=True), "bf16.enabled", "the run has bf16: false"),
        (lambda d: d.update(train_micro_batch_size_per_gpu=8), "train_micro_batch_size_per_gpu", "per_device_train_batch_size = 2"),
        (lambda d: d.update(train_batch_size=4), "train_batch_size", "= 8"),
        (lambda d: d.update(communication_data_type="bf16"), "communication_data_type", "trains in fp32"),
        (lambda d: d["zero_optimization"].update(stage=7), "zero_optimization.stage", "0 | 1 | 2 | 3"),
    ],
)
def test_broken_configs_fail_with_file_and_key(tmp_path, edit, key, text):
    path = broken(tmp_path, "ds_z2_config.json", edit)
    with pytest.raises(InputError) as ei:
        ds.effective(ds.read_file(path), run_cfg(), file=str(path), hidden_size=64)
    assert any(p.key == key and p.file == str(path) and text in p.message for p in ei.value.problems), str(ei.value)


def test_deepspeed_parser_refusal_is_ours(tmp_path):
    """Keys only DeepSpeed's own parser knows are wrong (pydantic, extra fields forbidden)."""
    path = broken(tmp_path, "ds_z3_config.json", lambda d: d["zero_optimization"].update(stage3_prefetch_bucket_sise=5))
    with pytest.raises(InputError) as ei:
        ds.effective(ds.read_file(path), run_cfg(), file=str(path), hidden_size=64)
    msg = str(ei.value)
    assert "DeepSpeed refuses it" in msg and str(path) in msg and "stage3_prefetch_bucket_sise" in msg


def test_invalid_json_names_the_line(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('{\n  "train_batch_size": "auto",\n  "zero_optimization": {"stage": 2,}\n}\n')
    with pytest.raises(InputError) as ei:
        ds.read_file(p)
    assert ei.value.problems[0].line == 3 and ei.value.problems[0].file == str(p)


@pytest.mark.slow
def test_cli_check_and_train_exit_2_on_a_broken_file(tmp_path, tiny_model_dir):
    path = broken(tmp_path, "ds_z2_config.json", lambda d: d["zero_optimization"].update(stage3_prefetch_bucket_sise=5, stage=3))
    cfg = write_yaml(tmp_path / "c.yaml", {"model_name_or_path": str(tiny_model_dir), "dataset": "cockpit_identity", "nproc_per_node": 2, "deepspeed": str(path), "use_cpu": True})
    for cmd in (("check", str(cfg), "--no-devices"), ("train", str(cfg), "--runs-dir", str(tmp_path / "runs"))):
        res = cockpit(*cmd)
        assert res.returncode == 2, res.stdout + res.stderr
        assert f"{path}: zero_optimization.stage3_prefetch_bucket_sise" in res.stderr and "Traceback" not in res.stderr
    good = write_yaml(tmp_path / "g.yaml", {"model_name_or_path": str(tiny_model_dir), "dataset": "cockpit_identity", "nproc_per_node": 2, "deepspeed": str(FIXTURES / "ds_z3_offload_config.json"), "use_cpu": True})
    assert cockpit("check", str(good), "--no-devices").returncode == 0


def test_the_shm_op_a_cpu_training_rank_skips_is_deepspeeds():
    """train/distributed.skip_deepspeed_shm_build replaces deepspeed.comm.torch.build_shm_op: pinned
    to DeepSpeed's code, so an upgrade that renames it or uses the op for training fails here."""
    import inspect

    import importlib

    # importlib: `import deepspeed.comm.torch as m` binds the torch package (deepspeed.comm re-exports it)
    ds_torch_comm = importlib.import_module("deepspeed.comm.torch")

    init_src = inspect.getsource(ds_torch_comm.TorchBackend.__init__)
    assert "self.shm_comm_op = build_shm_op()" in init_src
    # the op is used only by inference_all_reduce (DeepSpeed's inference engine), never by training's collectives
    users = [name for name, fn in inspect.getmembers(ds_torch_comm.TorchBackend, inspect.isfunction)
             if name != "__init__" and "shm_comm_op" in inspect.getsource(fn) or "inference_all_reduce_" in inspect.getsource(fn)]
    assert users == ["inference_all_reduce"], users
    from cockpit.train.distributed import skip_deepspeed_shm_build

    original = ds_torch_comm.build_shm_op
    try:
        skip_deepspeed_shm_build()
        assert ds_torch_comm.build_shm_op() is None
    finally:
        ds_torch_comm.build_shm_op = original
