"""MFU: FLOPs per token (cockpit/plan/flops.py), device peaks (cockpit/doctor/peak.py), the rank's
meter (cockpit/train/flops_meter.py) and a real tiny CPU run whose events and summary carry them."""

from __future__ import annotations

import json

import pytest

from cockpit.doctor.peak import PEAK_BF16_TFLOPS, cpu_peak, device_peak
from cockpit.plan.catalogue import CATALOGUE
from cockpit.plan.flops import flops_per_token, matmul_params
from cockpit.plan.params import analytic_counts, dims_of

LLAMA_31_8B = CATALOGUE["meta-llama/Llama-3.1-8B"]  # its config.json's numbers (the planner's catalogue)


def llama_8b():
    dims = dims_of(LLAMA_31_8B)
    return dims, analytic_counts(dims)


def test_llama_8b_flops_per_token_is_torchtitans():
    dims, counts = llama_8b()
    assert counts.total == 8_030_261_248  # torchtitan logs "8,030,261,248 total parameters" for llama3 8B
    # torchtitan: num_params - nparams_embedding (tok_embeddings only: the output projection counts)
    n = 8_030_261_248 - 128256 * 4096
    assert matmul_params(counts) == n == 7_504_924_672
    per = flops_per_token(dims, counts, 8192)
    # 6 N + 12 L H Q T, torchtitan's get_num_flop_per_token(num_params, model_args, seq_len=8192)
    assert per.dense == 6 * n == 45_029_548_032
    assert per.attention == 12 * 32 * 32 * 128 * 8192 == 12_884_901_888
    assert per.model == 57_914_449_920
    assert per.hardware == per.model  # no recomputation


def test_tied_embeddings_count_the_head_matmul_once():
    dims = dims_of({**LLAMA_31_8B, "tie_word_embeddings": True})
    counts = analytic_counts(dims)
    assert counts.lm_head == 0
    assert matmul_params(counts) == 7_504_924_672  # the head's matmul still runs


def test_frozen_weights_skip_their_weight_gradients():
    dims, counts = llama_8b()
    n = matmul_params(counts)
    lora = 20_971_520  # rank 8 on q,k,v,o,gate,up,down of the 8B
    share = lora / (counts.total + lora)
    per = flops_per_token(dims, counts, 4096, trainable_share=share, adapter_params=lora)
    # NeMo: (2 + trainable share) / 3 of the 6 N term, N with the adapter
    assert per.dense == pytest.approx(6 * (n + lora) * (2 + share) / 3)
    assert per.dense == pytest.approx(4 * (n + lora) + 2 * share * (n + lora))
    frozen_all = flops_per_token(dims, counts, 4096, trainable_share=0.0)
    assert frozen_all.dense == 4 * n  # forward + activation gradients only
    assert per.attention == frozen_all.attention == 12 * 32 * 32 * 128 * 4096  # no weights: not scaled


def test_recompute_is_hardware_flops_not_model_flops():
    dims, counts = llama_8b()
    plain = flops_per_token(dims, counts, 2048)
    gc = flops_per_token(dims, counts, 2048, recompute=True)
    assert gc.model == plain.model
    layers = 32 * counts.per_layer
    assert gc.recompute == 2 * layers + 4 * 32 * 32 * 128 * 2048  # one more forward of the decoder layers
    assert gc.hardware == gc.model + gc.recompute


@pytest.mark.parametrize(
    ("name", "cus", "dtype", "device", "tflops"),
    [
        ("AMD Instinct MI250X/MI250", 104, "bf16", "MI250", 181.05),
        ("AMD Instinct MI250X/MI250", 110, "bf16", "MI250X", 191.5),
        ("AMD Instinct MI300X", 304, "bf16", "MI300X", 1307.4),
        ("AMD Instinct MI300X", 38, "bf16", "MI300X (1/8 partition)", 163.43),  # CPX mode: one XCD
        ("AMD Instinct MI325X", 304, "fp16", "MI325X", 1307.4),
        ("AMD Instinct MI355X", 256, "bf16", "MI355X", 2500.0),
        ("NVIDIA H100 80GB HBM3", 132, "bf16", "H100", 989.4),
        ("NVIDIA H200", 132, "bf16", "H200", 989.4),
    ],
)
def test_peak_table(name, cus, dtype, device, tflops):
    peak = device_peak(name, cus, dtype)
    assert (peak.device, peak.tflops, peak.source) == (device, tflops, "table")


@pytest.mark.parametrize(
    ("name", "cus", "dtype"),
    [
        ("AMD Instinct MI250X/MI250", 96, "bf16"),  # neither 104 nor 110 CUs: which part is unknown
        ("NVIDIA H100 PCIe", 114, "bf16"),
        ("NVIDIA A10", 72, "bf16"),
        ("AMD Instinct MI300X", 304, "fp32"),  # the table holds bf16 / fp16 peaks
    ],
)
def test_peak_unknown(name, cus, dtype):
    peak = device_peak(name, cus, dtype)
    assert peak.tflops is None and peak.source == "unknown" and peak.why


def test_the_table_has_the_parts_named():
    assert set(PEAK_BF16_TFLOPS) == {"MI250", "MI250X", "MI300X", "MI325X", "MI355X", "H100", "H200"}


def test_cpu_peak_is_measured_once_then_read_from_the_cache(tmp_path):
    calls = []

    def measure(dtype, threads):
        from cockpit.doctor.peak import measure_cpu_tflops

        calls.append((dtype, threads))
        return measure_cpu_tflops(dtype, threads, size=256, seconds=0.05)

    first = cpu_peak("fp32", 1, tmp_path, measure=measure)
    assert first.source == "measured" and first.tflops > 0
    second = cpu_peak("fp32", 1, tmp_path, measure=measure)
    assert (second.source, second.tflops) == ("cached", first.tflops)
    assert calls == [("fp32", 1)]  # the second call read the cache
    cache = json.loads((tmp_path / "peak_flops.json").read_text())
    assert [v["tflops"] for v in cache.values()] == [first.tflops]
    other = cpu_peak("fp32", 2, tmp_path, measure=measure)  # another thread count: measured
    assert other.source == "measured" and calls[-1] == ("fp32", 2)


def test_meter_figures_per_device():
    from cockpit.doctor.peak import Peak
    from cockpit.train.flops_meter import FlopsMeter

    dims, counts = llama_8b()
    meter = FlopsMeter(dims, counts, 1.0, 0, False, Peak("H200", 989.4, "table"), world_size=8)
    fig = meter.figures(tokens_per_s=8 * 5000.0, samples_per_s=16.0, seq_len=4096)
    per = flops_per_token(dims, counts, 4096).model
    assert fig["tokens_per_s_per_device"] == 5000.0
    assert fig["samples_per_s_per_device"] == 2.0
    assert fig["mfu"] == pytest.approx(per * 5000 / 989.4e12, abs=1e-5)
    assert "hfu" not in fig
    gc = FlopsMeter(dims, counts, 1.0, 0, True, Peak("H200", 989.4, "table"), world_size=8)
    gc_fig = gc.figures(tokens_per_s=8 * 5000.0, samples_per_s=16.0, seq_len=4096)
    assert gc_fig["mfu"] == fig["mfu"]  # recomputation is not model FLOPs
    hardware = flops_per_token(dims, counts, 4096, recompute=True).hardware
    assert gc_fig["hfu"] == pytest.approx(hardware * 5000 / 989.4e12, abs=1e-5) and gc_fig["hfu"] > gc_fig["mfu"]
    warm = meter.figures(tokens_per_s=None, samples_per_s=16.0, seq_len=4096)
    assert warm["mfu"] is None and warm["tokens_per_s_per_device"] is None
    unknown = FlopsMeter(dims, counts, 1.0, 0, True, Peak("NVIDIA A10", None, "unknown", why="x"), world_size=1)
    fig = unknown.figures(tokens_per_s=100.0, samples_per_s=1.0, seq_len=128)
    assert fig["mfu"] is None and fig["tokens_per_s_per_device"] == 100.0 and fig["model_tflops_per_device"] > 0
    # a CPU peak measured on a busy machine, below what the run achieves: no MFU above 100 %
    stale = FlopsMeter(dims, counts, 1.0, 0, False, Peak("Xeon", 0.02, "cached", "fp32"), world_size=1)
    assert stale.figures(tokens_per_s=100.0, samples_per_s=1.0, seq_len=128)["mfu"] is None
    assert 0 < stale.figures(tokens_per_s=0.1, samples_per_s=1.0, seq_len=128)["mfu"] < 1


@pytest.mark.slow
def test_a_cpu_run_reports_mfu_and_consistent_tokens_per_s(tmp_path, tiny_model_dir, monkeypatch):
    from conftest import cockpit, read_events, tiny_config

    cache = tmp_path / "cache"
    cfg = tiny_config(tmp_path, tiny_model_dir, max_steps=8, probes=None, save_steps=100)
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), env={"COCKPIT_CACHE_DIR": str(cache)})
    assert res.returncode == 0, res.stdout + res.stderr
    run = next((tmp_path / "runs").iterdir())
    events = read_events(run)
    begin = next(e for e in events if e["kind"] == "train_begin")
    flops = begin["flops"]
    assert flops["peak_source"] == "measured" and flops["peak_tflops"] > 0 and flops["dtype"] == "fp32"
    assert 0 < flops["trainable_share"] < 0.5  # LoRA
    assert json.loads((cache / "peak_flops.json").read_text())  # measured once, kept
    steps = [e for e in events if e["kind"] == "step"]
    warm = [e for e in steps if not e["warmup"]]
    assert warm and all(e["mfu"] is None for e in steps if e["warmup"])
    for e in warm:
        assert 0 < e["mfu"] <= 1
    for prev, e in zip(steps, steps[1:]):
        if prev["warmup"]:  # the first interval after the warm-up is timed from the warm-up's end
            continue
        # tokens/s is the interval's tokens over its time (one rank: per device the same)
        assert e["tokens_per_s_per_device"] == pytest.approx(e["tokens_per_s"], rel=1e-3)
        dt = e["t"] - prev["t"]
        assert e["tokens_per_s"] == pytest.approx((e["tokens_seen"] - prev["tokens_seen"]) / dt, rel=0.2)
        mean_len = (e["tokens_seen"] - prev["tokens_seen"]) / (2 * (e["step"] - prev["step"]))
        per_token = 6 * flops["matmul_params"] * (2 + flops["trainable_share"]) / 3 + 12 * 2 * 4 * 16 * mean_len
        assert e["mfu"] == pytest.approx(per_token * e["tokens_per_s"] / (flops["peak_tflops"] * 1e12), rel=1e-2)
    summary = json.loads((run / "summary.json").read_text())
    assert 0 < summary["mfu"] <= 1
    assert summary["tokens_per_s_per_device"] == pytest.approx(summary["tokens_per_s"], rel=1e-3)
    assert summary["peak_tflops"] == flops["peak_tflops"]
    # what the MFU counts, said where it is shown (issue 53): the Summary's line
    from cockpit.run.follow import peak_short

    assert summary["trainable_share"] == pytest.approx(flops["trainable_share"]) and summary["peak_dtype"] == "fp32"
    assert peak_short(summary).startswith("· model FLOPs, frozen base; CPU ") and peak_short(summary).endswith(" fp32")
    mean_len = summary["tokens_seen"] / (summary["steps"] * 2)  # micro-batch 2, one rank
    assert summary["samples_per_s_per_device"] == pytest.approx(summary["tokens_per_s"] / mean_len, rel=1e-2)


def test_attach_lines_show_the_peak_and_mfu():
    from cockpit.run.follow import format_event

    begin = {"kind": "train_begin", "total_steps": 8, "epochs": 1.0, "global_batch": 4,
             "flops": {"peak_tflops": 989.4, "peak_source": "table", "peak_device": "H200", "dtype": "bf16",
                       "model_flops_per_token": 5.8e10, "why": None}}
    assert "peak 989.4 TFLOPS bf16 per device (H200, data sheet)" in format_event(begin, None)
    assert "MFU counts model FLOPs, HFU adds the recompute" in format_event(begin, None)  # full fine-tuning
    unknown = {**begin, "flops": {"peak_tflops": None, "peak_device": "NVIDIA A10", "why": "NVIDIA A10 (72 CUs) is not in the peak table"}}
    assert "MFU: peak unknown (NVIDIA A10 (72 CUs) is not in the peak table)" in format_event(unknown, None)
    step = {"kind": "step", "step": 6, "total_steps": 8, "epoch": 0.5, "loss": 1.0, "tokens_per_s": 16000.0,
            "tokens_per_s_per_device": 2000.0, "mfu": 0.4132}
    assert "16000 tok/s (2,000/device)  MFU 41.3%" in format_event(step, None)
    assert "MFU 0.52%" in format_event({**step, "mfu": 0.0052}, None)  # a CPU's small share keeps its digits


def test_live_state_and_devices_pane_show_per_device_figures():
    from cockpit.ui.formatting import devices
    from cockpit.ui.state import RunState

    st = RunState()
    st.apply([
        {"kind": "train_begin", "t": 1.0, "total_steps": 8, "world_size": 8,
         "flops": {"peak_tflops": 1307.4, "peak_source": "table", "peak_device": "MI300X", "dtype": "bf16",
                   "trainable_share": 0.0052}},
        {"kind": "step", "t": 2.0, "step": 5, "loss": 1.0, "tokens_per_s": 8000.0, "tokens_per_s_per_device": 1000.0,
         "samples_per_s_per_device": 0.5, "mfu": 0.3, "hfu": 0.4},
    ])
    wide = devices(st, width=120).plain
    assert "Per device 1,000 tok/s  0.50 samples/s  MFU 30.0% (HFU 40.0%)" in wide
    # what the MFU counts and its peak, beside it (issue 53): LoRA's frozen base, the device, its bf16 peak
    assert "MFU 30.0% (HFU 40.0%) · model FLOPs, frozen base; MI300X 1,307 TFLOPS bf16" in wide
    narrow = devices(st, width=40).plain
    assert "Per device 1,000 tok/s MFU 30.0% (HFU 40.0%)" in narrow  # samples/s gives way first
    st.apply([{"kind": "train_begin", "t": 3.0, "flops": {"peak_tflops": None, "peak_device": "NVIDIA A10"}},
              {"kind": "step", "t": 4.0, "step": 6, "loss": 1.0, "tokens_per_s_per_device": 900.0,
               "samples_per_s_per_device": 0.4, "mfu": None}])
    assert "MFU: peak unknown" in devices(st, width=120).plain


def test_compare_shows_mfu_rows_only_for_runs_that_have_them():
    from cockpit.compare import fmt_cell, summary_rows

    old = {"summary": {"tokens_per_s": 300.0}}
    new = {"summary": {"tokens_per_s": 300.0, "mfu": 0.127, "tokens_per_s_per_device": 300.0, "samples_per_s_per_device": 8.29}}
    assert "mfu" not in dict(summary_rows([old["summary"], old["summary"]]))
    rows = dict(summary_rows([old["summary"], new["summary"]]))
    assert rows["mfu"] == "MFU" and "tokens_per_s_per_device" in rows
    assert [fmt_cell("mfu", r["summary"]) for r in (old, new)] == ["-", "12.7%"]
    assert fmt_cell("samples_per_s_per_device", new["summary"]) == "8.29"
