"""Mixture-of-experts models (issue 64): LLaMA-Factory's moe_aux_loss_coef, the experts adapted by
``lora_target: all``, FLOPs from the active parameters, the planner's expert lines, the expert load
watched live. On tiny random Qwen3-MoE / Mixtral models built from their transformers configs
(``tests/conftest.py``: ``tiny_moe_dir``, ``build_tiny_moe``)."""

from __future__ import annotations

import pytest

from cockpit.errors import InputError

torch = pytest.importorskip("torch")


LF_MOE_YAML = """\
### model
model_name_or_path: {model}
moe_aux_loss_coef: 0.01
trust_remote_code: false

### method
stage: sft
do_train: true
finetuning_type: lora
lora_rank: 4
lora_target: all

### dataset
dataset: cockpit_identity
template: chatml
cutoff_len: 128

### train
per_device_train_batch_size: 2
gradient_accumulation_steps: 1
learning_rate: 5.0e-3
max_steps: 3
logging_steps: 1
save_steps: 100
use_cpu: true
"""


@pytest.mark.slow
def test_an_llamafactory_moe_yaml_trains_with_the_router_loss_in_the_events(tmp_path, tiny_moe_dir):
    from conftest import cockpit, read_events

    from cockpit.run.follow import format_event

    cfg = tmp_path / "qwen3_moe_lora_sft.yaml"
    cfg.write_text(LF_MOE_YAML.format(model=tiny_moe_dir))
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"))
    assert res.returncode == 0, res.stdout + res.stderr
    run = next((tmp_path / "runs").iterdir())
    steps = [e for e in read_events(run) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2, 3]
    for e in steps:
        # Switch's load-balancing loss: E * sum(f_i * P_i), about 1 x top_k for a near-uniform random router
        assert 1.0 < e["aux_loss"] < 8.0
        load = e["expert_load"]
        assert load["experts"] == 8 and load["top_k"] == 2 and load["layers"] == [0, 1, 2, 3]
        assert len(load["rows"]) == 4 and all(len(r) == 8 for r in load["rows"])
        assert "aux " in format_event(e, None)  # Live's log and attach show it beside the loss
    from cockpit.compare import read_curves
    from cockpit.store.rundir import RunDir

    curves = read_curves(RunDir(run))["curves"]  # cockpit compare's curves: the aux loss one of them
    assert curves["aux_loss"] == [e["aux_loss"] for e in steps] and "expert_load" not in curves
    # the loss the model trained on has the router loss in it: the config took the coefficient
    config = (run / "config.yaml").read_text()
    assert "moe_aux_loss_coef: 0.01" in config
    log = (run / "logs" / "rank0.log").read_text()
    adapted = next(line for line in log.splitlines() if "trainable parameters" in line)
    assert "mlp.experts.gate_up_proj" in adapted and "mlp.experts.down_proj" in adapted and "gate," not in adapted


def test_moe_aux_loss_coef_is_refused_by_name_on_a_dense_model():
    from transformers import LlamaConfig, Qwen3MoeConfig

    from cockpit.config.load import validate
    from cockpit.preflight.checks import check_moe_keys

    run = validate({"dataset": "x", "moe_aux_loss_coef": 0.001})
    assert run.moe_aux_loss_coef == 0.001
    with pytest.raises(InputError) as info:
        check_moe_keys(run, LlamaConfig())
    assert "moe_aux_loss_coef" in str(info.value) and "no routed experts" in str(info.value)
    check_moe_keys(run, Qwen3MoeConfig())  # an MoE model takes it
    from cockpit.train.variants import model_load_kwargs

    assert model_load_kwargs(run)["router_aux_loss_coef"] == 0.001
    assert model_load_kwargs(run)["output_router_logits"] is True
    assert "output_router_logits" not in model_load_kwargs(validate({"dataset": "x"}))


def _random_moe(family: str, vocab: int = 512, **over):
    """A small random MoE model in-process: its matmuls as FlopCounterMode counts them (eager attention,
    the experts' per-expert loop: torch counts neither the CPU's flash kernel nor grouped_mm)."""
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, num_experts_per_tok=2, tie_word_embeddings=False,
                  attn_implementation="eager", experts_implementation="eager", **over)  # fmt: skip
    torch.manual_seed(0)
    if family == "mixtral":
        return MixtralForCausalLM(MixtralConfig(num_local_experts=8, **common))
    if family == "gpt_oss":  # runs on the CPU too: attention sinks, biased experts, a biased router
        from transformers import GptOssConfig, GptOssForCausalLM

        layer_types = ["full_attention"] * common["num_hidden_layers"]
        return GptOssForCausalLM(GptOssConfig(num_local_experts=8, layer_types=layer_types, **common))
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(num_experts=8, moe_intermediate_size=64, **common))


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_flops_per_token_count_the_active_parameters_as_torch_counts_them(family):
    """A training step's forward + backward (full fine-tuning: every weight gets its gradient) of the
    small model, counted by torch, against the run's figure: 6 N + 12 L H Q T a token with N the active
    parameters (top-2 of 8 routed experts, the router, attention, the head)."""
    from torch.utils.flop_counter import FlopCounterMode

    from cockpit.plan.flops import flops_per_token
    from cockpit.plan.params import count_params, dims_of
    from cockpit.train.flops_meter import base_config

    model = _random_moe(family)
    batch, seq = 2, 32
    ids = torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(1))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    config = base_config(model)
    counts = count_params(config)
    assert counts.experts > 0 and counts.experts_active == counts.experts // 4  # top-2 of 8
    per = flops_per_token(dims_of(config), counts, seq)
    counted = counter.get_total_flops()
    print(f"{family}: counted {counted:,}  model FLOPs {per.model * batch * seq:,.0f}  N {per.matmul_params:,}")
    # within 0.5 % (measured 0.35 % / 0.19 %: the convention counts the norms' weights as matmul parameters;
    # gpt-oss 1.3 %: its biases, the experts' included, and attention sinks too)
    assert counted == pytest.approx(per.model * batch * seq, rel=0.015 if family == "gpt_oss" else 0.005)
    # every expert counted (the old figure) is over twice what the step does
    dense = flops_per_token(
        dims_of(config), count_params(config).__class__(**{**counts.as_dict(), "experts_active": counts.experts}), seq
    )
    assert dense.model * batch * seq > 2 * counted


def _trainable(model) -> tuple[float, set[str]]:
    total = trainable = 0
    names = set()
    for name, p in model.named_parameters():
        total += p.numel()
        if p.requires_grad:
            trainable += p.numel()
            names.add(name)
    return trainable / total, names


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_lora_target_all_adapts_the_experts_and_leaves_the_router_frozen(family):
    from cockpit.config.load import validate
    from cockpit.train.model import with_lora_adapter

    def adapted(target: str):
        run = validate({"dataset": "x", "finetuning_type": "lora", "lora_rank": 4, "lora_target": target})
        return with_lora_adapter(_random_moe(family), run)

    everything = adapted("all")
    share_all, names = _trainable(everything)
    share_attention, _ = _trainable(adapted("q_proj,k_proj,v_proj,o_proj"))
    assert share_all > 2 * share_attention  # the experts hold most of the weights
    assert any(".experts." in n and "lora_" in n for n in names)  # the fused expert tensors (target_parameters)
    router = ".router." if family == "gpt_oss" else ".gate."
    assert not any(router in n for n in names)  # the router: not adapted, not trained
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(2))
    everything(input_ids=ids, labels=ids).loss.backward()
    # the experts' adapters learn (lora_B first: lora_A's gradient goes through B, zero at the start)
    experts = [p for n, p in everything.named_parameters() if ".experts." in n and "lora_B" in n]
    assert experts and all(p.grad is not None and p.grad.abs().sum() > 0 for p in experts)
    if family != "gpt_oss":  # gpt-oss's router is no linear layer PEFT adapts (additional_target trains it)
        _, router_asked = _trainable(adapted("q_proj,gate"))
        assert any(".gate." in n for n in router_asked)  # named, the router is adapted (PEFT's target for it)


@pytest.mark.parametrize(
    "name,total,active",
    [("mi300x-lora-qwen3-30b-a3b", 30.5e9, 3.3e9), ("mi300x-lora-qwen3-235b-a22b-zero3-8", 235e9, 22e9)],
)
def test_cockpit_plan_names_total_and_active_parameters_of_the_moe_presets(name, total, active):
    from pathlib import Path

    from cockpit.commands.plan import render
    from cockpit.config.load import load_config
    from cockpit.plan import plan

    preset = Path(__file__).resolve().parent.parent / "presets" / f"{name}.yaml"
    res = plan(load_config(preset, check_paths=False), gpu_memory_gb=192, use_meta=False)
    d = res.as_dict()
    experts = d["params"]["experts"]
    # Qwen's published sizes (30.5B / 3.3B, 235B / 22B), from the config alone
    assert experts["total_params"] == pytest.approx(total, rel=0.01)
    assert experts["active_params"] == pytest.approx(active, rel=0.04)
    assert experts["routed"] == 128 and experts["top_k"] == 8 and experts["router_logits_kept"]
    assert 0 < experts["router_logits_bytes"] < experts["routed_activations_bytes"] < experts["expert_weights_bytes"]
    text = render(d)
    assert "B total params" in text and "B active a token" in text and "expert weights" in text
    assert "router logits" in text and "routed-expert activations" in text and "merged weights" in text
    assert res.verdict["status"] == "fits"
    verdict = next(line for line in text.splitlines() if line.startswith("verdict:"))
    assert verdict.split("->")[1].split("(")[0].strip().startswith("FITS")
    import re

    header = preset.read_text().split("### model")[0].replace("\n# ", " ")  # the planner's verdict in the comment
    said = re.search(r"([\d.]+)B active params a token.* planned peak ([\d.]+) GiB per GPU -> FITS on 192 GiB", header)
    assert said, header
    assert float(said.group(1)) == pytest.approx(experts["active_params"] / 1e9, abs=0.05)
    assert float(said.group(2)) == pytest.approx(res.estimate.peak / 2**30, abs=0.05)


def test_a_per_expert_checkpoint_is_loaded_whole_not_streamed(tiny_moe_dir):
    """transformers 5 saves an MoE model's experts apart (``mlp.experts.0.gate_proj.weight``) and fuses them
    as it loads; a streamed ZeRO-3 / FSDP2 load reads tensors by the model's names, so it would leave the fused
    experts to their random init (found so: the step-1 loss of a streamed ZeRO-3 run differed from FSDP2's)."""
    from types import SimpleNamespace

    from cockpit.models.weights import sharded_load_mode, weights_of

    weights = weights_of(SimpleNamespace(gguf_file=None, path=str(tiny_moe_dir), hub=False), fetch=False)
    assert weights.folder is None and "stores each expert's weights apart" in weights.why_whole
    assert sharded_load_mode(weights, world_size=2, quantized=False, fsdp=True, zero3=False) == "full"


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zero3", "fsdp2"])
def test_sharded_strategies_train_the_moe_on_two_ranks(tmp_path, tiny_moe_dir, strategy):
    """ZeRO-3 (the MoE blocks ZeRO-3 leaf modules, as LLaMA-Factory marks them) and FSDP2 on 2 CPU ranks:
    LoRA on every linear layer and the fused experts, the router loss on, 2 steps."""
    from conftest import ROOT, cockpit, read_events, tiny_config

    over = {"zero_stage": 3} if strategy == "zero3" else {"fsdp": "full_shard auto_wrap"}
    cfg = tiny_config(tmp_path, tiny_moe_dir, strategy, nproc_per_node=2, max_steps=2, cutoff_len=64, probes=None,
                      save_strategy="no", telemetry_interval_s=0, numa_bind="off", moe_aux_loss_coef=0.01, **over)  # fmt: skip
    env = {"TORCH_EXTENSIONS_DIR": str(ROOT / ".cache" / "torch_extensions"), "OMP_NUM_THREADS": "1"}
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), env=env, timeout=420)
    run = next((tmp_path / "runs").iterdir())
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    steps = [e for e in read_events(run) if e["kind"] == "step"]
    assert [e["step"] for e in steps] == [1, 2]
    assert all(e["aux_loss"] > 1.0 and e["expert_load"]["layers"] == [0, 1, 2, 3] for e in steps)
    # every token's top-2 counted once over both ranks' batches: the 4 layers see the same tokens
    assert steps[0]["expert_load"]["assignments"] % 4 == 0
    for rank in (0, 1):
        log = (run / "logs" / f"rank{rank}.log").read_text()
        assert "mlp.experts.gate_up_proj" in next(ln for ln in log.splitlines() if "trainable parameters" in ln)
        if strategy == "zero3":
            assert "MoE blocks gathered whole (leaf modules): Qwen3MoeSparseMoeBlock" in log
        else:
            assert "FSDP2: 4 x ['Qwen3MoeDecoderLayer']" in log


def _logging_steps(model, watch, callback, steps: int, batch: int = 4, seq: int = 32) -> None:
    """``steps`` logging steps as a run makes them: training forwards, then (every rank) the watch's
    sums read at the log, then rank 0's callback writing the step event and its alerts."""
    from types import SimpleNamespace

    from transformers import TrainerControl

    args = SimpleNamespace(per_device_train_batch_size=batch, gradient_accumulation_steps=1, num_train_epochs=1)
    state = SimpleNamespace(global_step=0, max_steps=steps, num_input_tokens_seen=0, epoch=0.0)
    control = TrainerControl()
    callback.on_train_begin(args, state, control)
    model.train()
    for step in range(1, steps + 1):
        ids = torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(step))
        with torch.no_grad():
            model(input_ids=ids)
        watch.take(1)
        state.global_step = step
        callback.on_log(args, state, control, logs={"loss": 6.0, "grad_norm": 1.0})


@pytest.mark.parametrize("rigged", [True, False], ids=["one-expert", "random-router"])
def test_a_router_that_sends_everything_to_one_expert_raises_the_expert_load_alerts(tmp_path, rigged):
    from cockpit.config.run_config import RunConfig
    from cockpit.store.events import EventWriter, read_all
    from cockpit.store.rundir import RunDir
    from cockpit.train import callbacks as cb
    from cockpit.train.moe import RouterWatch

    model = _random_moe("qwen3_moe")
    if rigged:  # every token's top-2 both expert 0, in every layer (the router's own output, changed)

        def everything_to_expert_0(_module, _inputs, output):
            logits, weights, chosen = output
            return logits, weights, torch.zeros_like(chosen)

        for module in model.modules():
            if type(module).__name__.endswith("Router"):
                module.register_forward_hook(everything_to_expert_0)
    watch = RouterWatch.attach(model)
    assert watch is not None and watch.layers == [0, 1, 2, 3] and watch.experts == 8
    run = RunDir(tmp_path)
    callback = cb.CockpitCallback(run, RunConfig(), 0, 1, EventWriter(run.events_path))
    callback.router_watch = watch
    callback._gather_memory = lambda: {}  # an all_gather of every rank's allocator figures: one rank here
    _logging_steps(model, watch, callback, steps=3)
    events = read_all(run.events_path)
    steps = [e for e in events if e["kind"] == "step"]
    alerts = [e for e in events if e["kind"] == "alert"]
    assert [e["expert_load"]["assignments"] for e in steps] == [4 * 32 * 2 * 4] * 3  # tokens x top-2 x layers
    if not rigged:  # a random router spreads the tokens: no alert
        assert not alerts and all(max(h[1] for h in e["expert_load"]["hot"]) < 4 for e in steps)
        return
    assert all(e["expert_load"]["rows"] == ["90000000"] * 4 for e in steps)  # expert 0 at 8x its fair share
    assert events.index(alerts[0]) > events.index(steps[2])  # after the third logging step in a row, not before
    by_code = {a["code"]: a for a in alerts}
    assert set(by_code) == {"expert_overloaded", "expert_idle"} and len(alerts) == 2  # once each
    assert "4 expert(s) overloaded" in by_code["expert_overloaded"]["message"]
    assert "layer 0 expert 0 (8.00x)" in by_code["expert_overloaded"]["message"]
    assert "28 expert(s) nearly unused" in by_code["expert_idle"]["message"]
    for alert in alerts:
        assert alert["level"] == "warn" and any("moe_aux_loss_coef" in r for r in alert["remedies"])
        assert any("learning rate" in r for r in alert["remedies"])
    _logging_steps(model, watch, callback, steps=2)  # still so: said once, not at every log
    assert len([e for e in read_all(run.events_path) if e["kind"] == "alert"]) == 2


def test_the_expert_pane_keeps_the_most_uneven_layers_and_drops_bars_that_do_not_fit():
    """Qwen3-30B-A3B's shape: 48 layers x 128 experts, over the event's cell budget (no level rows), and at
    80 columns no bar would fit anyway: each kept layer says its hottest and coldest expert."""
    from cockpit.store.expert_load import encode
    from cockpit.ui.formatting import expert_load
    from cockpit.ui.state import RunState

    counts = [[100.0] * 128 for _ in range(48)]
    counts[30][7], counts[11][90] = 3000.0, 0.0  # one overloaded expert, one starved
    load = encode(counts, list(range(48)), 8)
    assert "rows" not in load and len(load["hot"]) == 48  # compact: 48 x [expert, load] twice
    state = RunState()
    state.apply([{"kind": "step", "step": 40, "loss": 1.0, "expert_load": load}])
    lines = expert_load(state, 80, 3).plain.splitlines()
    assert lines[0].startswith("expert load at step 40 (top-8 of 128); the 2 most uneven of 48 layers")
    assert lines[1].startswith("L11 ") and "cold 90 0.00x" in lines[1]
    assert lines[2].startswith("L30 ") and "hot 7 24.5x" in lines[2]  # 3000 of 15,700: 24.5 x the mean
    assert all(len(line) <= 80 for line in lines)
    small = encode([[10.0, 30.0], [20.0, 20.0]], [0, 1], 1)  # two experts: the bars fit
    state.apply([{"kind": "step", "step": 41, "loss": 1.0, "expert_load": small}])
    assert expert_load(state, 80, 3).plain.splitlines()[1].startswith("L0 ▃▅ hot 1 1.5x")
