"""cockpit.shape: one answer for a run's world size, precision, strategy and sharding."""

from cockpit.config import load_config
from cockpit.shape import shape_of


def _cfg(tmp_path, text):
    (tmp_path / "d.jsonl").write_text('{"instruction": "hi", "output": "yo"}\n')
    path = tmp_path / "c.yaml"
    path.write_text("model_name_or_path: embedded\ndataset: d.jsonl\n" + text)
    return load_config(str(path)).keys_only()


def test_single_process_fp32_by_default(tmp_path):
    shape = shape_of(_cfg(tmp_path, ""))
    assert (shape.world_size, shape.multi_process, shape.precision, shape.strategy, shape.sharded) == (1, False, "fp32", "single process", False)


def test_nodes_times_processes_and_the_strategy_that_shards(tmp_path):
    shape = shape_of(_cfg(tmp_path, "nproc_per_node: 4\nnnodes: 2\nmaster_port: 29511\nbf16: true\nzero_stage: 3\n"))
    assert (shape.world_size, shape.precision, shape.zero_stage, shape.sharded) == (8, "bf16", 3, True)
    assert shape.strategy == "deepspeed ZeRO-3"
    ddp = shape_of(_cfg(tmp_path, "nproc_per_node: 2\nfp16: true\n"))
    assert (ddp.strategy, ddp.precision, ddp.sharded, ddp.zero_stage) == ("DDP", "fp16", False, None)
    fsdp = shape_of(_cfg(tmp_path, "nproc_per_node: 2\nfsdp: full_shard auto_wrap\n"))
    assert (fsdp.strategy, fsdp.sharded) == ("FSDP2 (full_shard auto_wrap)", True)
    zero2 = shape_of(_cfg(tmp_path, "nproc_per_node: 2\nzero_stage: 2\noffload: optimizer\n"))
    assert (zero2.strategy, zero2.sharded) == ("deepspeed ZeRO-2 + offload optimizer", False)
