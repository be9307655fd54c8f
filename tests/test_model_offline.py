"""Errors a user can act on faster (issue 50 item 9): a typo'd model name gets a did-you-mean (the
embedded names, model folders, the HF cache), a typo'd dataset a did-you-mean rather than a cut-off
list, and a hub id with no network answers within seconds (a cached one loads from the cache, an
uncached one is refused) instead of after the HF libraries' retries (51 s measured)."""

from __future__ import annotations

import json
import time

import pytest

from conftest import cockpit, tiny_config
from cockpit.errors import InputError
from cockpit.models import resolve
from cockpit.models.resolve import hub_ready, resolve_model
from tests.test_model_weights import put_in_hub_cache

UNREACHABLE = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


@pytest.fixture
def hub(tmp_path, monkeypatch):
    import huggingface_hub.constants as constants

    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    resolve.hub_reachable.cache_clear()
    yield root
    resolve.hub_reachable.cache_clear()


def problem(exc: pytest.ExceptionInfo) -> str:
    return str(exc.value.problems[0])


def test_a_typod_model_name_gets_a_did_you_mean(tmp_path, monkeypatch, hub, tiny_model_dir):
    with pytest.raises(InputError) as err:
        resolve_model("smollm2-135m-instrct")
    assert "did you mean 'smollm2-135m-instruct'" in problem(err)
    mine = tmp_path / "models" / "my-llama"
    mine.mkdir(parents=True)
    (mine / "config.json").write_text("{}")
    with pytest.raises(InputError) as err:
        resolve_model(str(tmp_path / "models" / "my-lama"))
    assert f"did you mean {str(mine)!r}" in problem(err)
    monkeypatch.chdir(tmp_path / "models")
    with pytest.raises(InputError) as err:
        resolve_model("my-lamma")
    assert "did you mean 'my-llama'" in problem(err)
    with pytest.raises(InputError) as err:
        resolve_model("something-else-entirely")
    assert "did you mean" not in problem(err)
    # a hub id the cache does not hold, the hub unreachable (HF_HUB_OFFLINE): the cache's near name
    put_in_hub_cache(hub, "org/tiny-llama", tiny_model_dir)
    with pytest.raises(InputError) as err:
        hub_ready(resolve_model("org/tiny-lama"))
    assert "HF_HUB_OFFLINE is set" in problem(err) and "did you mean 'org/tiny-llama'" in problem(err)
    cached = hub_ready(resolve_model("org/tiny-llama"))  # the cache holds it: loaded from there only
    assert cached.local_only and cached.kwargs() == {"local_files_only": True}


def test_the_hub_check_is_bounded_and_once_per_process(hub, monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    import socket

    silent = socket.create_server(("127.0.0.1", 0))  # accepts the connection, never answers
    try:
        t0 = time.monotonic()
        assert resolve.hub_reachable(UNREACHABLE) is False
        assert resolve.hub_reachable(f"http://127.0.0.1:{silent.getsockname()[1]}", 0.5) is False
        assert time.monotonic() - t0 < 3
    finally:
        silent.close()
    assert resolve.hub_reachable.cache_info().currsize == 2
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert resolve.hub_reachable("http://anything.invalid") is False


def test_a_hub_id_with_no_network_answers_within_seconds(tmp_path, tiny_model_dir):
    """The real CLI, the hub's endpoint refusing connections: no retries, a quick answer; a model the
    HF cache holds is checked from the cache."""
    hub = tmp_path / "hub"
    put_in_hub_cache(hub, "org/tiny-llama", tiny_model_dir)
    env = {"HF_ENDPOINT": UNREACHABLE, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "0"}
    absent = tiny_config(tmp_path, tiny_model_dir, "absent", model_name_or_path="org/tiny-lama")
    t0 = time.monotonic()
    res = cockpit("check", str(absent), env=env, timeout=300)
    took = time.monotonic() - t0
    assert res.returncode == 2, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert f"{UNREACHABLE} is unreachable" in out and "did you mean 'org/tiny-llama'" in out
    assert "Retry" not in out and took < 30, (took, out[-2000:])
    cached = tiny_config(tmp_path, tiny_model_dir, "cached", model_name_or_path="org/tiny-llama")
    res = cockpit("check", str(cached), "--json", env=env, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert "Retry" not in res.stderr
    json.loads(res.stdout)


def test_a_typod_dataset_gets_a_did_you_mean_not_a_cut_off_list(tmp_path):
    from cockpit.config.run_config import RunConfig
    from cockpit.data.dataset_info import resolve_datasets

    with pytest.raises(InputError) as err:
        resolve_datasets(RunConfig(dataset="cockpit_identty"))
    assert "did you mean 'cockpit_identity'" in problem(err)
    names = {f"set_{i:02d}": {"file_name": "x.jsonl"} for i in range(30)} | {"alpaca_en_demo": {"file_name": "a.json"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(names))
    with pytest.raises(InputError) as err:
        resolve_datasets(RunConfig(dataset="alpaca_en_dem", dataset_dir=str(tmp_path)))
    said = problem(err)
    assert "did you mean 'alpaca_en_demo'" in said and "set_00" not in said and "..." not in said


def test_a_cached_hub_model_loads_its_weights_offline_without_retries(tmp_path, tiny_model_dir):
    """The ranks' and chat's model load (ModelRef.model_kwargs): transformers' auto classes look for an
    adapter_config.json on the hub even under local_files_only unless told again (5 retries, ~25 s)."""
    import os
    import subprocess
    import sys

    hub = tmp_path / "hub"
    put_in_hub_cache(hub, "org/tiny-llama", tiny_model_dir)
    code = (
        "from transformers import AutoModelForCausalLM\n"
        "from cockpit.models.resolve import hub_ready, resolve_model\n"
        "ref = hub_ready(resolve_model('org/tiny-llama'))\n"
        "assert ref.local_only, ref\n"
        "AutoModelForCausalLM.from_pretrained(ref.path, **ref.model_kwargs())\n"
        "print('loaded')\n"
    )
    env = {**os.environ, "HF_ENDPOINT": UNREACHABLE, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "0"}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0 and "loaded" in res.stdout, res.stderr[-2000:]
    assert "Retry" not in res.stderr and time.monotonic() - t0 < 30, res.stderr[-2000:]
