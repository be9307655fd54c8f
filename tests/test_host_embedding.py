"""cockpit.train.host_embedding: a LoRA run's input embedding in host memory, the same numbers."""

from __future__ import annotations

import pytest

from cockpit.models.embedding_place import host_embedding_off
from cockpit.plan import plan

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from cockpit.config.run_config import RunConfig  # noqa: E402
from cockpit.config.schema import default_config  # noqa: E402
from cockpit.train.host_embedding import HostEmbedding, keep_on_host  # noqa: E402
from cockpit.train.model import lora_model, log_embedding_place  # noqa: E402

GiB = 2**30
TINY = dict(
    hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=128, max_position_embeddings=256, tie_word_embeddings=False,
)
JOB_8B = {"model_name_or_path": "meta-llama/Llama-3.1-8B", "finetuning_type": "lora", "lora_rank": 8,
          "lora_target": "all", "bf16": True, "cutoff_len": 2048, "per_device_train_batch_size": 2,
          "gradient_checkpointing": True}


def adapted(host_embedding: bool, tied: bool = False, **over):
    """A bf16 Llama with its LoRA adapter as the rank builds it (cockpit.train.model.lora_model)."""
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY, "tie_word_embeddings": tied}))
    base = base.to(torch.bfloat16)
    base.config.use_cache = False
    cfg = RunConfig.from_mapping(
        {**default_config(), "lora_rank": 4, "lora_alpha": 8, "lora_target": "all", "bf16": True, **over}
    )
    model = lora_model(base, cfg, host_embedding=host_embedding)
    for p in model.parameters():  # lora_B starts at zero: give the adapters a real path
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(p.numel()))
    return model


def two_steps(model, ids):
    """Losses and LoRA gradients of two forward/backward passes under reentrant checkpointing (the
    inputs of the checkpointed layers must require grad: PEFT's hook on the embedding's output)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.train()
    losses, grads = [], {}
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.detach())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return losses, grads


def test_same_losses_and_gradients_bit_for_bit():
    ids = torch.randint(0, TINY["vocab_size"], (2, 48), generator=torch.Generator().manual_seed(1))
    on_device, on_host = adapted(False), adapted(True)
    assert isinstance(on_host.get_input_embeddings(), HostEmbedding)
    assert type(on_device.get_input_embeddings()) is torch.nn.Embedding
    losses_a, grads_a = two_steps(on_device, ids)
    losses_b, grads_b = two_steps(on_host, ids)
    assert losses_a == losses_b
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == 2 * 7 * 2  # A and B of 7 linears, 2 layers
    for name in grads_a:
        assert grads_a[name].abs().sum() > 0, name  # the checkpointed layers got their gradients
        assert torch.equal(grads_a[name], grads_b[name]), name


def test_the_table_stays_in_host_memory_and_out_of_the_adapter():
    model = adapted(True)
    table = model.get_input_embeddings()
    names = {n for n, _ in model.named_parameters()} | set(model.state_dict())
    assert not any("embed_tokens" in n for n in names), sorted(n for n in names if "embed" in n)
    model.to("meta")  # what model.to(device) does to every parameter and buffer
    assert table.host_weight.device.type == "cpu" and table.weight.shape == (TINY["vocab_size"], TINY["hidden_size"])
    assert model.get_base_model().lm_head.weight.device.type == "meta"
    lines = []
    log_embedding_place(model, lines.append)
    assert lines and "input embedding in host memory" in lines[0], lines


def test_a_cast_of_the_model_casts_the_table_and_a_move_leaves_it_on_the_host():
    """``model.half()`` / ``.to(dtype)`` (DeepSpeed's engine casts the module so) reach the table, in host
    memory; ``.to(device)`` does not move it; the rows looked up are the cast table's."""
    model = adapted(True)
    table = model.get_input_embeddings()
    reference = table.host_weight.clone()
    model.half()
    assert table.host_weight.dtype == torch.float16 and table.host_weight.device.type == "cpu"
    model.to(torch.float32)
    assert table.host_weight.dtype == torch.float32 and torch.equal(table.host_weight, reference.half().float())
    model.to("meta")
    assert table.host_weight.device.type == "cpu" and table.host_weight.dtype == torch.float32
    ids = torch.tensor([[3, 5, 3]])
    assert torch.equal(table(ids), reference.half().float()[ids])


def test_a_tied_head_or_a_config_that_trains_the_table_keeps_it():
    assert type(adapted(True, tied=True).get_input_embeddings()) is torch.nn.Embedding
    tied = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY, "tie_word_embeddings": True}))
    assert keep_on_host(tied, RunConfig(finetuning_type="lora")) == "the LM head is tied to it"
    assert type(adapted(True, additional_target="embed_tokens").get_input_embeddings()) is not HostEmbedding
    base = RunConfig(finetuning_type="lora", stage="sft")
    assert host_embedding_off(base, sharded=False) == ""
    refused = {
        "finetuning_type": ({"finetuning_type": "full"}, False),
        "grpo": ({"stage": "grpo"}, False),
        "ZeRO-3": ({}, True),
        "torch.compile": ({"torch_compile": True}, False),
        "embed_tokens": ({"lora_target": "q_proj,embed_tokens"}, False),
        "add_tokens": ({"add_tokens": "<x>"}, False),
        "resize_vocab": ({"resize_vocab": True}, False),
    }
    for word, (over, sharded) in refused.items():
        assert word in host_embedding_off(base.replace(**over), sharded=sharded), word


def test_the_planner_moves_the_table_to_the_host_line(monkeypatch):
    """Issue 35's 8B LoRA job: the 128,256 x 4096 bf16 table (0.98 GiB) leaves the device, and the
    allocated figure is within the 16.5 GiB target with the defaults."""
    import cockpit.plan.spec

    def both(job):
        on_host = plan(job, use_meta=False).estimate
        with monkeypatch.context() as m:
            m.setattr(cockpit.plan.spec, "host_embedding_off", lambda cfg, sharded: "kept, to compare")
            return on_host, plan(job, use_meta=False).estimate

    on_host, kept = both(JOB_8B)
    table = 128256 * 4096 * 2
    assert on_host.host_bytes - kept.host_bytes == table
    assert kept.tensor_peak - on_host.tensor_peak == pytest.approx(table, rel=0.02)
    assert on_host.tensor_peak <= 16.5 * GiB < kept.tensor_peak
    weights = next(t for t in on_host.terms if t.name == "weights")
    assert "input embedding" in weights.formula and weights.host_bytes == table
    qlora = plan({**JOB_8B, "quantization_bit": 4}, use_meta=False).estimate
    assert qlora.tensor_peak <= 8 * GiB
    # SmolLM2 ties its head to the table: nothing moves
    tied_on_host, tied_kept = both({**JOB_8B, "model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    assert tied_on_host.host_bytes == tied_kept.host_bytes and tied_on_host.tensor_peak == tied_kept.tensor_peak


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory, tiny_model_dir):
    """The tiny Llama with an LM head of its own (Llama-3.1-8B's shape of things; the embedded
    SmolLM2 ties its head to the table)."""
    config = transformers.AutoConfig.from_pretrained(str(tiny_model_dir))
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("untied-llama")
    transformers.LlamaForCausalLM(config).save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir)).save_pretrained(out)
    return out


def test_a_lora_run_trains_probes_and_saves_with_the_table_in_host_memory(tmp_path, untied_model_dir):
    """The real CLI: the rank logs the move, the probes generate through the host table, the losses
    are finite and the adapter holds no embedding."""
    from safetensors.torch import load_file

    from conftest import cockpit, read_events, tiny_config

    cfg = tiny_config(tmp_path, untied_model_dir, max_steps=3, save_steps=3)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    run = next((tmp_path / "runs").iterdir())
    logs = "".join(p.read_text(errors="replace") for p in (run / "logs").iterdir())
    assert "input embedding in host memory" in logs, logs[-3000:]
    events = read_events(run)
    losses = [e["loss"] for e in events if e["kind"] == "step"]
    assert len(losses) == 3 and all(0 < loss < 100 for loss in losses), losses
    probes = [e for e in events if e["kind"] == "probe_results"]
    assert probes and probes[-1].get("results"), probes[-1:]
    saved = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    assert saved and not any("embed" in k for k in saved), sorted(saved)[:5]
