"""enable_liger_kernel / torch_compile: the Trainer's switches, or a refusal naming what is missing."""

from __future__ import annotations

import importlib.util
import shutil

import pytest

from cockpit.config.load import validate
from cockpit.config.run_config import RunConfig
from cockpit.errors import InputError
from cockpit.train import kernels


def test_liger_is_refused_on_the_cpu_with_the_reason():
    with pytest.raises(InputError, match="enable_liger_kernel.*Triton.*GPU"):
        kernels.kernel_arguments(RunConfig(enable_liger_kernel=True), use_cpu=True)


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed here")
def test_liger_without_the_package_is_refused_on_a_gpu_too():
    with pytest.raises(InputError, match="liger-kernel package"):
        kernels.kernel_arguments(RunConfig(enable_liger_kernel=True), use_cpu=False)


def test_torch_compile_becomes_the_trainer_switch_or_a_refusal(monkeypatch, tmp_path):
    cfg = validate({"dataset": "x", "torch_compile": True, "use_cpu": True})
    monkeypatch.delenv(kernels.REGIONAL, raising=False)  # kernel_arguments asks accelerate for regional compilation
    if kernels.compile_refusal(True) is None:
        from cockpit.train.arguments import training_arguments

        assert training_arguments(cfg, {"checkpoints": tmp_path}, True, 1).torch_compile is True
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(InputError, match="torch_compile.*C\\+\\+ compiler"):
        kernels.kernel_arguments(cfg, use_cpu=True)
    assert kernels.kernel_arguments(cfg, use_cpu=False) == {"torch_compile": True}  # GPUs compile with Triton


def test_planner_drops_the_logits_with_liger():
    from cockpit.plan import estimate_config

    base = {"model_name_or_path": "smollm2-135m-instruct", "cutoff_len": 1024, "per_device_train_batch_size": 4}
    plain, liger = estimate_config(base)[1], estimate_config({**base, "enable_liger_kernel": True})[1]
    assert plain.components["logits"] > 0 and liger.components["logits"] == 0
    assert liger.peak < plain.peak and any("liger" in n for n in liger.notes)


def test_torch_compile_mode_reaches_each_compiled_layer(monkeypatch, tmp_path, tiny_model_dir):
    """torch_compile_mode (HF's key): the Trainer's TorchDynamoPlugin compiles each decoder layer with it, as
    a run's first step does (accelerate's regional compile); read off the compiled layers' inductor options
    (nothing compiles before a forward). Refused without torch_compile: true; the modes are torch's."""
    import torch._inductor
    from transformers import AutoModelForCausalLM

    from cockpit.config.keys.base import COMPILE_MODES
    from cockpit.train.arguments import training_arguments
    from cockpit.train.trainer import CockpitTrainer

    assert set(COMPILE_MODES) <= set(torch._inductor.list_mode_options())
    with pytest.raises(InputError, match="torch_compile_mode.*needs torch_compile: true"):
        validate({"dataset": "x", "torch_compile_mode": "default"})
    if kernels.compile_refusal(True):
        pytest.skip(kernels.compile_refusal(True))
    monkeypatch.delenv(kernels.REGIONAL, raising=False)  # kernel_arguments sets it; the teardown takes it away
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    options = {}
    for mode in ("max-autotune-no-cudagraphs", None):
        cfg = validate({"dataset": "x", "torch_compile": True, "torch_compile_mode": mode, "use_cpu": True})
        args = training_arguments(cfg, {"checkpoints": tmp_path}, True, 1)
        trainer = CockpitTrainer(model=model, args=args)
        layers = [
            m for m in trainer.accelerator.prepare_model(model).modules() if type(m).__name__ == "OptimizedModule"
        ]
        assert layers
        options[mode] = {k: layers[0].get_compiler_config()[k] for k in ("max_autotune", "triton.cudagraphs")}
    assert options["max-autotune-no-cudagraphs"] == {"max_autotune": True, "triton.cudagraphs": False}
    assert options[None] == {"max_autotune": False, "triton.cudagraphs": False}  # torch's default mode
