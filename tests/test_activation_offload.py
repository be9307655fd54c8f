"""``use_unsloth_gc`` (LLaMA-Factory's key): each checkpointed layer's saved input lives in pinned host
memory (transformers' activation checkpointing ``offload``: torch's ``save_on_cpu``) and is copied back
for the backward. Same loss and gradients as plain checkpointing; the planner moves those bytes to
the host. Its device-memory effect is measured by tests/test_gpu_twins.py on a GPU."""

from __future__ import annotations

import pytest
from conftest import cockpit, read_events, tiny_config

from cockpit.config.load import validate
from cockpit.config.run_config import RunConfig
from cockpit.errors import InputError
from cockpit.plan import plan
from cockpit.train.variants import gradient_checkpointing, offload_checkpoints


def test_use_unsloth_gc_needs_gradient_checkpointing():
    with pytest.raises(InputError) as err:
        validate(
            {
                "model_name_or_path": "x",
                "dataset": "cockpit_identity",
                "gradient_checkpointing": False,
                "use_unsloth_gc": True,
            }
        )
    assert "use_unsloth_gc: offloads the gradient checkpoints, and gradient checkpointing is off" in str(err.value)


def counted_packs(model, batch) -> tuple[int, dict]:
    """Loss backward under an outer saved-tensor hook: how many tensors it packed, and the gradients."""
    import torch

    packs = 0

    def pack(t):
        nonlocal packs
        packs += 1
        return t

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch, labels=batch["input_ids"]).loss
    loss.backward()
    return packs, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_offloaded_checkpoints_are_packed_by_save_on_cpu_with_the_same_gradients(tiny_model_dir):
    """Checkpointing as the Trainer turns it on, then offloaded as Cockpit's callback does: the layer
    inputs are packed by save_on_cpu (an outer hook no longer sees them), and every gradient is the same."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    model.train()
    batch = {"input_ids": torch.randint(0, 1000, (2, 24))}
    seen = {}
    model.activation_checkpointing_enable(
        activation_checkpointing_kwargs=gradient_checkpointing(RunConfig(gradient_checkpointing=True))[1]
    )
    seen[False] = counted_packs(model, batch)
    assert offload_checkpoints(model) >= model.config.num_hidden_layers  # the decoder layers (and the model's own)
    assert offload_checkpoints(model) == 0  # once
    seen[True] = counted_packs(model, batch)
    (plain_packs, plain), (offload_packs, offloaded) = seen[False], seen[True]
    layers = model.config.num_hidden_layers
    assert plain_packs - offload_packs >= layers, (plain_packs, offload_packs)  # each layer's input, at least
    assert plain.keys() == offloaded.keys()
    for name in plain:
        torch.testing.assert_close(offloaded[name], plain[name], rtol=0, atol=0, msg=name)


def test_the_planner_moves_the_checkpoints_to_the_host():
    """The 8B LoRA job of issue 35: its checkpointed layer inputs (32 x 4096 tokens x 4096 x 2 B = 1 GiB)
    leave the device for pinned host memory; the allocated figure drops by about that."""
    job = {
        "model_name_or_path": "meta-llama/Llama-3.1-8B",
        "finetuning_type": "lora",
        "lora_rank": 8,
        "lora_target": "all",
        "bf16": True,
        "cutoff_len": 2048,
        "per_device_train_batch_size": 2,
        "gradient_checkpointing": True,
    }
    GiB = 2**30
    plain, offloaded = (plan({**job, **over}, use_meta=False).estimate for over in ({}, {"use_unsloth_gc": True}))
    layer_inputs = 32 * 4096 * 4096 * 2
    # 31 of 32 layer inputs leave (one is back for its recompute); the offloaded run may peak at another
    # moment (end of backward), so the drop can be a little less
    assert 0.9 * layer_inputs < plain.tensor_peak - offloaded.tensor_peak <= layer_inputs * 31 / 32 * 1.001
    assert offloaded.host_bytes - plain.host_bytes == pytest.approx(layer_inputs, rel=0.01)
    assert offloaded.tensor_peak < plain.tensor_peak <= 16.5 * GiB  # the table in host memory already fits it
    assert any("use_unsloth_gc" in line for line in [t.formula for t in offloaded.terms] + offloaded.notes)
    assert not any("use_unsloth_gc" in line for line in [t.formula for t in plain.terms] + plain.notes)


@pytest.mark.slow
def test_a_run_with_offloaded_checkpoints_trains_the_same_losses(tmp_path, tiny_model_dir):
    losses = {}
    for name, over in (("plain", {}), ("offload", {"use_unsloth_gc": True})):
        cfg = tiny_config(tmp_path, tiny_model_dir, name, gradient_checkpointing=True, max_steps=3, probes=None, **over)
        res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / name), timeout=600)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        run = next((tmp_path / name).iterdir())
        losses[name] = [e["loss"] for e in read_events(run) if e["kind"] == "step"]
        logs = "".join(p.read_text(errors="replace") for p in (run / "logs").iterdir())
        assert ("checkpointed modules keep their saved inputs in host memory" in logs) == (name == "offload")
    assert len(losses["plain"]) == 3 and losses["offload"] == losses["plain"], losses


def test_the_verdict_suggests_offloading_when_the_checkpoints_decide_it(tmp_path):
    """8B LoRA at 16k tokens on a 24 GiB device: 4 GiB of checkpointed layer inputs decide the verdict;
    offloading them is the cheapest change that fits, and the report shows the allocated figure."""
    cfg = tmp_path / "long.yaml"
    cfg.write_text(
        "model_name_or_path: meta-llama/Llama-3.1-8B\ndataset: cockpit_identity\nfinetuning_type: lora\n"
        "lora_target: all\nbf16: true\ncutoff_len: 16384\nper_device_train_batch_size: 1\ngradient_checkpointing: true\n"
    )
    res = cockpit("plan", str(cfg), "--gpu-memory", "24", timeout=120)
    assert res.returncode != 0 or "DOES NOT FIT" in res.stdout, res.stdout
    assert "DOES NOT FIT on 24 GiB" in res.stdout and "set use_unsloth_gc: true ->" in res.stdout, res.stdout
    allocated = next(ln for ln in res.stdout.splitlines() if ln.strip().startswith("allocated"))
    assert "max_memory_allocated" in allocated
