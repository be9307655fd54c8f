"""The memory-pressure alert (cockpit/telemetry/pressure.py): pure detector on recorded and
GPU-shaped traces; the real CPU run that raises it is in test_node_telemetry_slow.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cockpit.store.events import encode
from cockpit.telemetry.pressure import MemoryPressure, remedy_set

pytestmark = pytest.mark.serial  # timing windows: run alone (scripts/test.sh)

FIXTURES = Path(__file__).parent / "fixtures" / "memory"


def replay(watch: MemoryPressure, steps: list[dict], mb: int = 2, ga: int = 1, rocm: bool = False) -> list[dict]:
    alerts = []
    for s in steps:
        a = watch.observe(s["step"], s["mem"], micro_batch=mb, accumulation=ga, rocm=rocm)
        if a:
            alerts.append(a)
    return alerts


def gpu_trace(n_ranks: int = 8, capacity: float = 196592.0) -> list[dict]:
    """GPU-shaped (8 x MI300X, 192 GiB): the caching allocator's reserved memory creeps up with
    fragmentation while per-step peaks vary a little with sequence length; rank 5 gets the
    longest batches and its reserved memory crosses 92 % of the device at step 7."""
    steps = []
    for step in range(1, 11):
        mem = {}
        for r in range(n_ranks):
            peak = 150000 + 1500 * ((step * 7 + r * 3) % 5)  # +-2 % per step
            reserved = 158000 + step * (3300 if r == 5 else 600)
            mem[str(r)] = {"allocated_mb": 141000.0, "reserved_mb": float(reserved), "peak_mb": float(peak),
                           "capacity_mb": capacity, "source": "torch.cuda", "node_rank": r // 4, "local_rank": r % 4}
        steps.append({"step": step, "mem": mem})
    return steps


def test_near_capacity_on_a_gpu_trace_names_the_rank_once_with_the_remedies():
    alerts = replay(MemoryPressure(headroom=0.08, swing=0.25), gpu_trace(), mb=4, ga=2, rocm=True)
    assert len(alerts) == 1
    a = alerts[0]
    assert a["code"] == "memory_pressure" and a["trigger"] == "near_capacity" and a["rank"] == 5
    assert "at step 7" in a["message"] and "rank 5 (node 1)" in a["message"] and "reserved" in a["message"]
    assert 158000 + 7 * 3300 > 0.92 * 196592 > 158000 + 6 * 3300  # the step it crossed, by the numbers
    assert a["remedy_set"] == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4}
    assert a["remedy_env"] == {"PYTORCH_HIP_ALLOC_CONF": "expandable_segments:True"}
    assert any("halve per_device_train_batch_size (4 -> 2)" in r for r in a["remedies"])
    assert any("PYTORCH_HIP_ALLOC_CONF=expandable_segments:True" in r for r in a["remedies"])
    json.loads(encode("alert", **a))
    # a smaller headroom: the alert comes later, when reserved passes 95 % (swings are only +-2 %)
    later = replay(MemoryPressure(headroom=0.05, swing=0.25), gpu_trace(), mb=4, ga=2)
    assert [a["message"].rsplit(" ", 1)[1] for a in later] == ["9"]
    assert replay(MemoryPressure(headroom=0.0, swing=0.25), gpu_trace(), mb=4, ga=2) == []


def test_swing_on_the_recorded_cpu_trace():
    doc = json.loads((FIXTURES / "cpu_tiny_llama_live_tensors.json").read_text())
    peaks = [s["mem"]["0"]["peak_mb"] for s in doc["steps"]]
    alerts = replay(MemoryPressure(headroom=0.08, swing=0.25), doc["steps"])
    assert len(alerts) == 1 and alerts[0]["trigger"] == "swing"
    step = int(alerts[0]["message"].rsplit("step ", 1)[1])
    i = step - 1
    assert i >= 2  # the first step is never compared
    assert abs(peaks[i] - peaks[i - 1]) / peaks[i - 1] > 0.25
    assert all(abs(peaks[k] - peaks[k - 1]) / peaks[k - 1] <= 0.25 for k in range(2, i))
    assert alerts[0]["remedy_env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    largest = max(abs(peaks[k] - peaks[k - 1]) / peaks[k - 1] for k in range(2, len(peaks)))
    assert replay(MemoryPressure(headroom=0.08, swing=largest + 0.01), doc["steps"]) == []
    assert replay(MemoryPressure(headroom=0.0, swing=0.0), doc["steps"]) == []  # both off


def test_the_first_step_of_an_attempt_is_not_compared():
    first_jump = [{"step": s, "mem": {"0": {"peak_mb": p, "capacity_mb": 1e6}}} for s, p in ((1, 100.0), (2, 300.0), (3, 310.0))]
    assert replay(MemoryPressure(swing=0.25), first_jump) == []
    later_jump = first_jump + [{"step": 4, "mem": {"0": {"peak_mb": 100.0, "capacity_mb": 1e6}}}]
    assert [a["trigger"] for a in replay(MemoryPressure(swing=0.25), later_jump)] == ["swing"]


@pytest.mark.parametrize("mb,ga,want", [(4, 2, (2, 4)), (2, 1, (1, 2)), (3, 1, (1, 3)), (6, 4, (3, 8)), (1, 8, None)])
def test_remedy_keeps_the_global_batch(mb, ga, want):
    got = remedy_set(mb, ga)
    if want is None:
        assert got is None
    else:
        assert (got["per_device_train_batch_size"], got["gradient_accumulation_steps"]) == want
        assert got["per_device_train_batch_size"] * got["gradient_accumulation_steps"] == mb * ga
