"""A vision-language model loaded partitioned on several ranks (issue 63), as text models are
(tests/test_sharded_load.py): under ZeRO-3 and FSDP2 each rank reads only its part of every tensor from the
safetensors files, under the names transformers gives the checkpoint's keys as it loads them (its conversion
mapping: a LLaVA saved as ``language_model.model.layers...`` is ``model.language_model.layers...`` in the model;
cockpit.train.sharded_load.checkpoint_names), so no rank holds a whole copy of the model.

1. Every family Cockpit trains (LLaVA, Qwen2-VL, Qwen3-VL, Gemma 3), with its checkpoint's keys as transformers
   5.23 saves them and as the model names them: the streamed fill gives exactly ``from_pretrained``'s tensors.
   A checkpoint whose tensors transformers converts rather than renames (a mixture-of-experts' per-expert
   weights, fused as it loads) is refused by name, and the ranks load it whole.
2. A random LLaVA of 277 MiB in fp32 (a bf16 checkpoint, as hub models ship) on 2 gloo ranks under ZeRO-3: each
   rank reads its own half of every tensor, and its private memory grows by about half the model as it loads
   (measured: 145 MiB per rank; 367-374 MiB when every rank loaded the model whole, before this change). The step
   and the adapter equal a whole load's: the bitwise fill of 1., and tests/test_vlm_strategies.py (the tiny LLaVA
   under ZeRO-3 and FSDP2 against DDP, to 1e-4). By hand, the embedded VLM (540 MiB in fp32) whole vs partitioned,
   private memory at load per rank: ZeRO-3 873 -> 618 MiB, FSDP2 866 -> 610 MiB; loss and adapter bitwise equal.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import read_events
from test_strategy_runs import train
from test_vlm_strategies import _one_image_one_text  # writes zero3.json too

pytestmark = pytest.mark.slow
FAMILIES = ("tiny_llava_dir", "tiny_qwen2_vl_dir", "tiny_qwen3_vl_dir", "tiny_gemma3_dir")


def _as_the_model_names_it(folder: Path, out: Path, model) -> Path:
    """``folder`` with its weights saved under the model's own state-dict names (tied tensors once, under their
    first name, as transformers saves them): the layout of a checkpoint saved without transformers' renaming."""
    from safetensors.torch import save_file

    out.mkdir()
    for f in folder.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, out / f.name)
    seen: set[int] = set()
    tensors = {}
    for name, t in model.state_dict().items():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            tensors[name] = t.contiguous()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _streamed(folder: Path):
    """The model built on the meta device and filled from ``folder``'s files as one FSDP2 rank fills its shards
    (a plain tensor is held whole); the names filled; the checkpoint's names -> the model's."""
    import torch

    from cockpit.config.run_config import RunConfig
    from cockpit.train import sharded_load

    skeleton = sharded_load.empty_skeleton(RunConfig(trust_remote_code=False), folder, torch.float32, {})
    assert next(skeleton.parameters()).device.type == "meta"
    ties, names = sharded_load.tied_names(skeleton), sharded_load.checkpoint_names(skeleton, folder)
    buffers = {n: b.detach().clone() for n, b in skeleton.named_buffers()}
    skeleton.to_empty(device="cpu")  # unties, as fully_shard does
    with torch.no_grad():
        for n, b in skeleton.named_buffers():
            b.copy_(buffers[n])
    read: dict[str, int] = {}
    filled = sharded_load.fill_own_shards_from_files(skeleton, folder, torch.float32, ties, names=names, read=read)
    assert read["elements_read"] == read["elements_in_files"] > 0  # one rank holding everything reads everything
    return skeleton, filled, names


@pytest.mark.budget(20, reason="four tiny vision-language models, each loaded whole and streamed twice")
def test_each_vlm_family_streams_its_checkpoint_under_transformers_names(request, tmp_path, tiny_moe_dir):
    import torch
    from transformers import AutoModelForImageTextToText

    from cockpit.models.resolve import resolve_model
    from cockpit.models.weights import sharded_load_mode, weights_of
    from cockpit.train import sharded_load

    renamed = {}
    for fixture in FAMILIES:
        folder = request.getfixturevalue(fixture)
        weights = weights_of(resolve_model(str(folder), log=lambda *_: None), fetch=False)
        assert weights.folder == str(folder), weights  # streams, as the planner plans it
        for fsdp, zero3, mode in ((True, False, "fsdp_meta"), (False, True, "zero3")):
            assert sharded_load_mode(weights, world_size=2, quantized=False, fsdp=fsdp, zero3=zero3) == mode
        whole = AutoModelForImageTextToText.from_pretrained(str(folder), dtype=torch.float32)
        expected = whole.state_dict()
        own = _as_the_model_names_it(folder, tmp_path / fixture, whole)
        for layout in (folder, own):
            model, filled, names = _streamed(layout)
            assert filled == {n for n, _ in model.named_parameters(remove_duplicate=False)}, (fixture, layout)
            got = model.state_dict()
            assert got.keys() == expected.keys(), (fixture, layout, sorted(got.keys() ^ expected.keys())[:4])
            different = [k for k in expected if not torch.equal(got[k], expected[k])]
            assert not different, (fixture, layout, different[:4])
            renamed[fixture, layout == own] = sum(a != b for a, b in names.items())
    print(json.dumps({f"{k[0]}{' (model names)' if k[1] else ''}": n for k, n in renamed.items()}))
    assert renamed["tiny_llava_dir", False] > 0  # transformers 5.23 saves a LLaVA under the older names
    assert all(renamed[f, True] == 0 for f in FAMILIES)  # a checkpoint in the model's names is read as it is
    # a checkpoint whose tensors transformers converts (per-expert weights fused as they load): refused by name
    from cockpit.config.run_config import RunConfig

    with pytest.raises(sharded_load.StreamRefused, match="experts"):
        sharded_load.empty_skeleton(RunConfig(trust_remote_code=False), tiny_moe_dir, torch.float32, {})


# a LLaVA of about 75M parameters (300 MB in fp32, 150 MB as bf16 safetensors): the tiny LLaVA's layout with a
# wider, deeper language model, its tied 49k-token embedding a third of it
TEXT = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=4,
            head_dim=64)  # fmt: skip


@pytest.fixture(scope="module")
def wide_llava_dir(tmp_path_factory, tiny_llava_dir) -> Path:
    import torch
    from transformers import AutoConfig, LlavaForConditionalGeneration

    out = tmp_path_factory.mktemp("wide-llava")
    cfg = AutoConfig.from_pretrained(str(tiny_llava_dir))
    for key, value in TEXT.items():
        setattr(cfg.text_config, key, value)
    torch.manual_seed(0)
    LlavaForConditionalGeneration(cfg).to(torch.bfloat16).save_pretrained(out)  # as hub models ship
    for f in tiny_llava_dir.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out / f.name)
    return out


def _load_growth(trace: Path) -> dict[int, float]:
    """Each rank's private-memory peak while it built and loaded the model, less its private memory before
    (``COCKPIT_TRACE_RSS``'s lines: ``rank R LABEL now MiB peak MiB``)."""
    start: dict[int, float] = {}
    out: dict[int, float] = {}
    for line in trace.read_text().splitlines():
        words = line.split()
        rank, now, peak = int(words[1]), float(words[words.index("now") + 1]), float(words[-1])
        if "placed_model: start" in line:
            start[rank] = now
        elif "placed_model: built" in line:
            out[rank] = peak - start[rank]
    return out


@pytest.mark.budget(50, reason="a 2-rank ZeRO-3 training of one step of a 300 MB LLaVA")
def test_a_llava_loads_partitioned_under_zero3(tmp_path, wide_llava_dir):
    """Each rank reads its own half of every tensor, under transformers' names for the LLaVA's older ones, and its
    private memory grows by about half the model as it loads (the module docstring's numbers); the planner plans
    the load the run took."""
    model_mb = 2 * sum(f.stat().st_size for f in wide_llava_dir.glob("*.safetensors")) / 2**20  # held in fp32
    assert 250 < model_mb < 400, model_mb
    data = _one_image_one_text(tmp_path)
    trace = tmp_path / "rss.trace"
    env = {"MALLOC_MMAP_THRESHOLD_": str(2**20), "COCKPIT_TRACE_RSS": str(trace)}  # as tests/test_sharded_load.py
    run = train(tmp_path, wide_llava_dir, "zero3", template="llava", dataset="vlm", dataset_dir=str(data),
                cutoff_len=64, per_device_train_batch_size=1, max_steps=1, nproc_per_node=2,
                deepspeed=str(tmp_path / "zero3.json"), probes=None, timeout=420, env=env)  # fmt: skip
    growth = _load_growth(trace)
    at_load = {e["rank"]: (e["vmhwm_mb"], e["rss_anon_peak_mb"]) for e in read_events(run)
               if e["kind"] == "rank_memory" and e["phase"] == "loaded"}  # fmt: skip
    print(json.dumps({"model_mb": round(model_mb), "load_growth_mb": growth, "vmhwm_rss_anon_at_load": at_load}))
    assert sorted(growth) == [0, 1], growth
    for rank in (0, 1):
        log = (run / "logs" / f"rank{rank}.log").read_text()
        assert "model loaded (zero3: partitioned as it loads)" in log
        line = next(x for x in log.splitlines() if "zero3 streamed load" in x)
        read, total = (int(w) for w in line.split("read ")[1].split(" elements")[0].split(" of the checkpoint's "))
        assert 0.45 * total <= read <= 0.55 * total, line  # its own half of every tensor
        assert "tensor names renamed as transformers loads them" in line  # the LLaVA's older names
        assert growth[rank] <= 0.7 * model_mb, (rank, growth, model_mb)  # half of it, and the read buffers
    from cockpit.plan import plan  # the planner plans the load the run took (cockpit.models.weights' rule)

    host = plan(yaml.safe_load((run / "config.yaml").read_text()), use_meta=False, suggest=False).as_dict()["host"]
    assert host["load"] == "zero3" and host["pattern"].startswith("sharded"), host


def test_the_planner_plans_the_embedded_vlm_by_name_as_the_ranks_load_it(tmp_path, monkeypatch, tiny_llava_dir):
    """`cockpit plan` of a config naming the embedded VLM (presets/cpu-vlm-demo.yaml) reads its built folder, and
    on 2 ranks under ZeRO-3 / FSDP2 plans the load sharded (it was refused: not in the catalogue); before it is
    built, the planner says how to build it."""
    from cockpit.errors import InputError
    from cockpit.models.embedded_vlm import CACHE_NAME
    from cockpit.plan import plan

    monkeypatch.setenv("COCKPIT_CACHE_DIR", str(tmp_path))
    raw = {"model_name_or_path": "smollm2-135m-vlm", "template": "llava", "dataset": "x", "use_cpu": True,
           "nproc_per_node": 2}  # fmt: skip
    with pytest.raises(InputError, match="built on first use"):
        plan({**raw, "zero_stage": 3}, use_meta=False, suggest=False)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / CACHE_NAME).symlink_to(tiny_llava_dir)  # as ensure_embedded_vlm leaves it
    for extra, load in (({"zero_stage": 3}, "zero3"), ({"fsdp": "full_shard auto_wrap"}, "fsdp_meta"), ({}, "full")):
        host = plan({**raw, **extra}, use_meta=False, suggest=False).as_dict()["host"]
        assert host["load"] == load, (extra, host)
