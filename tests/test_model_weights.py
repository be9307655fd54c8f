"""Where a model's weights are, and so how the ranks load it (cockpit.models.weights): one rule for
the ranks and the planner's host line. A hub id resolves to its HF cache snapshot (the GPU presets
name hub ids); GGUF, .bin-only and partial downloads load whole, and both say why. The streamed
(sharded) load builds the model with the full load's options (attention kernel, RoPE scaling)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cockpit.models.resolve import ModelRef, resolve_model
from cockpit.models.weights import Weights, sharded_load_mode, weights_of

COMMIT = "c" * 40


def put_in_hub_cache(hub: Path, repo_id: str, folder: Path, commit: str = COMMIT, main: bool = True) -> None:
    """``folder``'s files as ``repo_id``'s snapshot at ``commit`` (refs/main unless not ``main``) in
    an HF hub cache, linked as the cache links its blobs."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for f in folder.iterdir():
        (snap / f.name).symlink_to(f.resolve())
    (repo / "refs").mkdir(exist_ok=True)
    if main:
        (repo / "refs" / "main").write_text(commit)


def bin_only_copy(model_dir: Path, out: Path) -> Path:
    """``model_dir`` with its weights as a pytorch_model.bin pickle instead of safetensors."""
    import torch
    from safetensors.torch import load_file

    out.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    state = {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    torch.save(state, out / "pytorch_model.bin")
    return out


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    import huggingface_hub.constants as constants

    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return root


def test_a_local_safetensors_folder_streams(tiny_model_dir):
    w = weights_of(ModelRef(str(tiny_model_dir)), fetch=False)
    assert w == Weights(str(tiny_model_dir))


def test_a_hub_id_streams_from_its_cache_snapshot_at_its_revision(hub, tiny_model_dir):
    put_in_hub_cache(hub, "org/tiny", tiny_model_dir)
    put_in_hub_cache(hub, "org/tiny", tiny_model_dir, commit="d" * 40, main=False)
    main = weights_of(resolve_model("org/tiny"), fetch=True)  # offline: the cache's copy
    assert main.folder and main.folder.endswith(f"snapshots/{COMMIT}") and not main.pending
    pinned = weights_of(resolve_model("org/tiny", revision="d" * 40), fetch=False)
    assert pinned.folder and pinned.folder.endswith("snapshots/" + "d" * 40)


def test_a_hub_id_not_on_this_machine_is_pending_for_the_planner_and_named_for_the_ranks(hub):
    assert weights_of(resolve_model("org/absent"), fetch=False) == Weights(None, pending=True)
    ranks = weights_of(resolve_model("org/absent"), fetch=True)  # HF_HUB_OFFLINE: nothing fetched
    assert ranks.folder is None and not ranks.pending
    assert "org/absent is not in this machine's Hugging Face cache and cannot be fetched" in ranks.why_whole


def test_gguf_bin_only_and_partial_downloads_load_whole_and_say_why(tmp_path, tiny_model_dir, embedded_dir):
    gguf = weights_of(ModelRef(str(tmp_path), gguf_file="m.gguf"), fetch=False)
    assert gguf.folder is None and "m.gguf is a GGUF file" in gguf.why_whole
    pickled = bin_only_copy(tiny_model_dir, tmp_path / "bin")
    w = weights_of(ModelRef(str(pickled)), fetch=False)
    assert w.folder is None and ".bin weights only" in w.why_whole
    partial = tmp_path / "partial"
    shutil.copytree(tiny_model_dir, partial)
    names = sorted(p.name for p in partial.glob("*.safetensors"))
    weight_map = {"a.weight": names[0], "b.weight": "model-00002-of-00002.safetensors"}
    (partial / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    w = weights_of(ModelRef(str(partial)), fetch=False)
    assert w.folder is None and "lacks 1 of its safetensors shards (e.g. model-00002-of-00002.safetensors)" in w.why_whole


@pytest.mark.parametrize(
    ("weights", "facts", "mode"),
    [
        (Weights("/m"), dict(world_size=2, quantized=False, fsdp=False, zero3=True), "zero3"),
        (Weights("/m"), dict(world_size=2, quantized=False, fsdp=True, zero3=False), "fsdp_meta"),
        (Weights(None, pending=True), dict(world_size=8, quantized=False, fsdp=False, zero3=True), "zero3"),
        (Weights(None, "gguf"), dict(world_size=2, quantized=False, fsdp=False, zero3=True), "full"),
        (Weights("/m"), dict(world_size=1, quantized=False, fsdp=False, zero3=True), "full"),
        (Weights("/m"), dict(world_size=2, quantized=True, fsdp=False, zero3=True), "full"),
        (Weights("/m"), dict(world_size=2, quantized=False, fsdp=False, zero3=False), "full"),  # DDP, ZeRO-1/2
    ],
)
def test_load_mode_rule(weights, facts, mode):
    assert sharded_load_mode(weights, **facts) == mode


def test_the_planner_plans_the_load_the_ranks_take(hub, tiny_model_dir, tmp_path):
    from cockpit.plan import plan

    put_in_hub_cache(hub, "org/tiny", tiny_model_dir)
    put_in_hub_cache(hub, "org/pickled", bin_only_copy(tiny_model_dir, tmp_path / "bin"))
    base = {"use_cpu": True, "nproc_per_node": 2, "deepspeed": "ds_z3_config.json", "finetuning_type": "lora"}

    def host(model: str) -> dict:
        return plan({**base, "model_name_or_path": model}, host_memory_gb=64, use_meta=False, suggest=False).as_dict()["host"]

    cached, pickled, absent = host("org/tiny"), host("org/pickled"), host("meta-llama/Llama-3.1-8B")
    assert cached["load"] == "zero3" and cached["pattern"].startswith("sharded")
    assert pickled["load"] == "full" and ".bin weights only" in pickled["pattern"]
    assert absent["load"] == "zero3" and "the ranks fetch the hub id's safetensors first" in absent["pattern"]


def test_the_streamed_skeleton_keeps_the_attention_kernel_and_rope_scaling(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from cockpit.config.run_config import RunConfig
    from cockpit.train.sharded_load import empty_skeleton
    from cockpit.train.variants import model_load_kwargs

    cfg = RunConfig(flash_attn="eager", rope_scaling="linear", cutoff_len=2048, trust_remote_code=False)
    ref = ModelRef(str(tiny_model_dir))
    opts = model_load_kwargs(cfg, ref, log=lambda *_: None)
    assert opts["attn_implementation"] == "eager" and opts["rope_parameters"]["factor"] == 4.0  # 2048 / 512
    full = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32, **opts)
    skeleton = empty_skeleton(cfg, tiny_model_dir, torch.float32, opts)
    assert skeleton.config._attn_implementation == full.config._attn_implementation == "eager"
    assert skeleton.config.rope_parameters == full.config.rope_parameters
    assert skeleton.config.rope_parameters["rope_type"] == "linear"
    full_freq = full.model.rotary_emb.inv_freq
    assert torch.equal(skeleton.model.rotary_emb.inv_freq, full_freq)  # a real buffer, scaled alike
    assert next(skeleton.parameters()).device.type == "meta"


def test_zero3s_random_init_waits_for_a_parameter_the_checkpoint_lacks(tiny_model_dir, tmp_path):
    """ZeRO-3's streamed load skips transformers' random init (every module gathered whole, all of it
    overwritten by the checkpoint) unless a parameter is missing from the checkpoint."""
    import torch
    import transformers.integrations.deepspeed as hf_deepspeed
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from cockpit.train.sharded_load import not_all_parameters_in, random_init_deferred

    original = hf_deepspeed.initialize_weights_zero3
    with random_init_deferred() as deferred:
        assert hf_deepspeed.initialize_weights_zero3 is not original
        assert hf_deepspeed.initialize_weights_zero3(None) is None  # what from_config calls: nothing happens
    assert hf_deepspeed.initialize_weights_zero3 is original and callable(deferred)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    assert not_all_parameters_in(model, tiny_model_dir) == []  # tied lm_head counted once
    partial = tmp_path / "partial"
    partial.mkdir()
    (file,) = tiny_model_dir.glob("*.safetensors")
    tensors = load_file(str(file))
    dropped = next(k for k in tensors if k.endswith("layers.0.mlp.up_proj.weight"))
    save_file({k: v for k, v in tensors.items() if k != dropped}, str(partial / file.name))
    assert not_all_parameters_in(model, partial) == [dropped]


@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_each_ranks_zero3_partition_is_read_from_the_file_alone(tmp_path, world):
    """DeepSpeed's layout: flat elements padded to a multiple of the world size, rank r holding
    [r * size, (r + 1) * size). Read by each rank from the file, the partitions rebuild the tensor."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from cockpit.train.sharded_load import fill_partition

    tensors = {"w": torch.arange(7 * 5, dtype=torch.bfloat16).reshape(7, 5), "b": torch.arange(11.0), "s": torch.tensor(3.0)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    with safe_open(str(tmp_path / "m.safetensors"), framework="pt") as f:
        for name, t in tensors.items():
            numel = t.numel()
            size = -(-numel // world)
            parts = []
            for rank in range(world):
                out = torch.full((size,), -1.0)
                fill_partition(out, f.get_slice(name), rank, numel, torch.float32)
                parts.append(out)
            flat = torch.cat(parts)
            assert torch.equal(flat[:numel], t.reshape(-1).float()), name
            assert torch.equal(flat[numel:], torch.zeros(size * world - numel)), name
