"""The side folders of the README's install (``<venv>/lowrank-site``: bitsandbytes, GaLore, APOLLO;
``<venv>/trackers-site``: the experiment trackers), kept off every process's sys.path: each config key that
needs one of their packages puts that folder on its ranks' PYTHONPATH, ``cockpit check`` counts a package in
its side folder as installed (the same answer as on sys.path), and ``cockpit doctor`` says what is where."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, cockpit, prerequisite, read_events

from cockpit import side_site


def fake_package(site: Path, module: str, dist: str = "", version: str = "1.2.3") -> None:
    """An importable-looking package and its dist-info (nothing here imports it)."""
    (site / module).mkdir(parents=True, exist_ok=True)
    (site / module / "__init__.py").write_text("")
    info = site / f"{(dist or module).replace('-', '_')}-{version}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist or module}\nVersion: {version}\n")


@pytest.fixture
def sites(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """Two side folders holding every side package (fakes), named by their variables."""
    low, tracks = tmp_path / "lowrank", tmp_path / "trackers"
    for module, dist in (("bitsandbytes", "bitsandbytes"), ("galore_torch", "galore-torch"),
                         ("apollo_torch", "apollo-torch")):
        fake_package(low, module, dist, "0.50.2" if module == "bitsandbytes" else "1.0")
    for module in side_site.TRACKER_MODULES.values():
        fake_package(tracks, module, side_site.DISTRIBUTIONS.get(module, module))
    monkeypatch.setenv("COCKPIT_LOWRANK_SITE", str(low))
    monkeypatch.setenv("COCKPIT_TRACKERS_SITE", str(tracks))
    monkeypatch.setenv("PYTHONPATH", "/users/own")
    for module in side_site.SITE_OF:  # the suite's own path has none of them (the premise of the side folders)
        assert side_site._on_path(module) is None, module
    return low, tracks


# key -> the side folders (in order) its ranks get; one row per key that needs a side package
RULES = [
    ({}, []),
    ({"finetuning_type": "lora", "lora_rank": 8}, []),
    ({"quantization_bit": 4}, ["lowrank"]),  # QLoRA: bitsandbytes
    ({"quantization_bit": 8}, ["lowrank"]),
    ({"ref_model_quantization_bit": 4}, ["lowrank"]),  # DPO's quantized reference model
    ({"optim": "adamw_8bit"}, ["lowrank"]),  # bitsandbytes' optimizers
    ({"optim": "paged_adamw_32bit"}, ["lowrank"]),
    ({"optim": "adamw_torch"}, []),
    ({"use_galore": True}, ["lowrank"]),
    ({"use_apollo": True}, ["lowrank"]),
    ({"report_to": "wandb"}, ["trackers"]),
    ({"report_to": "tensorboard,mlflow"}, ["trackers"]),
    ({"report_to": "none"}, []),
    ({"use_swanlab": True}, ["trackers"]),
    ({"quantization_bit": 4, "report_to": "wandb"}, ["lowrank", "trackers"]),
    ({"report_to": "trackio", "use_galore": True}, ["lowrank", "trackers"]),
    # HF's own optimizer names for GaLore / APOLLO import the same packages (the key sweep found them missing)
    ({"optim": "galore_adamw"}, ["lowrank"]),
    ({"optim": "galore_adamw_8bit_layerwise"}, ["lowrank"]),
    ({"optim": "apollo_adamw"}, ["lowrank"]),
    ({"optim": "adamw_torch"}, []),
]


@pytest.mark.parametrize(("keys", "wanted"), RULES, ids=[str(k) for k, _ in RULES])
def test_each_key_that_needs_a_side_package_puts_its_folder_on_the_ranks_path(sites, keys, wanted):
    folders = {"lowrank": str(sites[0]), "trackers": str(sites[1])}
    path = side_site.rank_pythonpath(keys)
    if not wanted:
        assert path is None
    else:  # the side folders first (once each), then the user's own PYTHONPATH
        assert path == os.pathsep.join([*(folders[w] for w in wanted), "/users/own"])


def test_a_package_installed_into_the_venv_needs_no_side_folder(sites, tmp_path, monkeypatch):
    """``pip install 'cockpit-tune[qlora]'`` puts bitsandbytes on sys.path: the ranks inherit it, no side
    folder is added (its wheel wins either way); the trackers still come from theirs."""
    venv = tmp_path / "venv-site"
    fake_package(venv, "bitsandbytes", version="0.51.0")
    monkeypatch.syspath_prepend(str(venv))
    assert side_site.rank_pythonpath({"quantization_bit": 4}) is None
    assert side_site.rank_pythonpath({"quantization_bit": 4, "report_to": "wandb"}) == f"{sites[1]}{os.pathsep}/users/own"
    assert side_site.available("bitsandbytes") and side_site.installed_at("bitsandbytes") == ("0.51.0", str(venv))


def test_a_package_missing_everywhere_is_checks_refusal_not_the_paths(sites, tmp_path, monkeypatch):
    monkeypatch.setenv("COCKPIT_LOWRANK_SITE", str(tmp_path / "empty"))
    assert side_site.rank_pythonpath({"quantization_bit": 4}) is None
    assert not side_site.available("bitsandbytes")
    assert side_site.available("wandb")  # the other folder still holds its own


def test_check_counts_the_side_folder_as_installed_and_refuses_what_neither_holds(sites, tmp_path, monkeypatch):
    """One answer for both: ``cockpit check``'s QLoRA, tracker and optimizer rules accept a package that
    only a side folder holds, and refuse, naming the key and the install command, what neither has."""
    from cockpit.config import validate
    from cockpit.errors import InputError

    def check(**keys):
        return validate({"dataset": "cockpit_identity", **keys}, check_paths=False)

    assert check(quantization_bit=4).quantization_bit == 4
    assert check(report_to="wandb,mlflow").report_to == "wandb,mlflow"
    monkeypatch.setenv("COCKPIT_LOWRANK_SITE", str(tmp_path / "empty"))
    monkeypatch.setenv("COCKPIT_TRACKERS_SITE", str(tmp_path / "empty"))
    with pytest.raises(InputError, match=r"quantization_bit: 4-bit weights need bitsandbytes, installed neither on "
                                         r"sys.path nor in .*empty: pip install 'cockpit-tune\[qlora\]', or .*--target"):
        check(quantization_bit=4)
    with pytest.raises(InputError, match=r"report_to: wandb is not installed here \(neither on sys.path nor in "
                                         r".*empty\): pip install 'cockpit-tune\[trackers\]'"):
        check(report_to="wandb")


def test_the_launch_gives_the_ranks_the_real_side_folders(tmp_path):
    """After the README's install (the real <venv>/lowrank-site and trackers-site): a QLoRA run with
    wandb and mlflow gets both folders on its rank's PYTHONPATH from ``node_launch``; a plain run neither."""
    from cockpit.config import validate
    from cockpit.strategy.launch import node_launch

    prerequisite(side_site.holds("bitsandbytes") and side_site.holds("wandb") and side_site.holds("mlflow"),
                 "the side folders of scripts/bootstrap.sh --for test")

    def rank_path(**keys) -> str | None:
        cfg = validate({"dataset": "cockpit_identity", "use_cpu": True, **keys}, check_paths=False)
        (rank,) = node_launch(tmp_path, "r", cfg).ranks
        return rank["env"].get("PYTHONPATH")

    qlora = rank_path(quantization_bit=4, report_to="wandb,mlflow")
    assert qlora is not None and qlora.split(os.pathsep)[:2] == [str(side_site.folder()),
                                                                  str(side_site.folder(site="trackers"))]
    assert rank_path() == os.environ.get("PYTHONPATH")


def test_doctor_says_which_key_finds_which_package_where(sites, tmp_path):
    from cockpit.doctor import PASS, SKIP, TorchFacts, run_checks

    env = dict(os.environ)
    (extras,) = run_checks(env, only=["extras"])
    assert extras.status == PASS, extras
    rows = extras.seen.splitlines()
    assert rows[0] == (f"QLoRA (quantization_bit, ref_model_quantization_bit, optim: adamw_8bit / paged_* / lion_*): "
                       f"bitsandbytes 0.50.2 in {sites[0]}")
    assert rows[1] == f"GaLore (use_galore): galore-torch 1.0 in {sites[0]}"
    assert rows[3].startswith(f"trackers (report_to, use_swanlab): tensorboard 1.2.3 in {sites[1]}; wandb 1.2.3 in")
    assert f"mlflow-skinny 1.2.3 in {sites[1]}" in rows[3]

    empty = {**env, "COCKPIT_LOWRANK_SITE": str(tmp_path / "none"), "COCKPIT_TRACKERS_SITE": str(tmp_path / "none")}
    (extras,) = run_checks(empty, only=["extras"])
    assert extras.status == SKIP  # optional; check refuses the configs that need them
    rows = extras.seen.splitlines()
    assert rows[0].endswith("bitsandbytes not installed: pip install 'cockpit-tune[qlora]', or "
                            f"{side_site.install_command(empty)}, or bash scripts/bootstrap.sh (the side folders)")
    assert "wandb, mlflow, trackio, swanlab not installed: pip install 'cockpit-tune[trackers]'" in rows[3]
    (bnb,) = run_checks(empty, only=["bitsandbytes"], facts=TorchFacts(importable=True, version="cpu"))
    assert bnb.status == SKIP and bnb.seen == f"not installed (neither on sys.path nor in {tmp_path / 'none'})"
    assert side_site.install_command(empty) in bnb.fix


def test_doctor_cli_shows_the_real_side_folders():
    """``cockpit doctor`` after the README's install: the row names bitsandbytes' version and its folder."""
    prerequisite(side_site.holds("bitsandbytes"), "the side folders of scripts/bootstrap.sh --for test")
    res = cockpit("doctor", "--json", timeout=300)
    (extras,) = [c for c in json.loads(res.stdout) if c["id"] == "extras"]
    assert f"bitsandbytes 0.50.2 in {side_site.folder()}" in extras["seen"], extras
    assert sys.prefix in extras["seen"]


_LOAD_WITHOUT_BNB = """
import importlib.util, json, sys
assert importlib.util.find_spec("bitsandbytes") is None, "bitsandbytes is importable here"
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = tok.apply_chat_template([{"role": "user", "content": "Who are you?"}], add_generation_prompt=True,
                              return_tensors="pt", return_dict=True)["input_ids"]
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=4, do_sample=False)[0, ids.shape[1]:]
print(json.dumps({"quantization_config": getattr(model.config, "quantization_config", None),
                  "dtypes": sorted({str(p.dtype) for p in model.parameters()}),
                  "bnb_loaded": "bitsandbytes" in sys.modules, "answer": tok.decode(out, skip_special_tokens=True)}))
"""


@pytest.mark.slow  # ~3 min on the loaded 2-core box (3 steps of the demo in 4-bit)
def test_readme_install_trains_qlora_through_the_plain_cli_and_exports_without_bitsandbytes(tmp_path):
    """Issue 49's first 'done when': after the README's install (bitsandbytes only in <venv>/lowrank-site,
    off this process's path) the demo preset with ``quantization_bit=4`` trains 3 steps through the plain
    ``cockpit train`` (no test-only PYTHONPATH: the launch gives the rank the side folder), and
    ``cockpit export --merge`` writes a model that loads and answers in a process that cannot import
    bitsandbytes."""
    prerequisite(side_site.holds("bitsandbytes"), "the side folders of scripts/bootstrap.sh --for test")
    assert side_site._on_path("bitsandbytes") is None  # the premise: only the side folder has it
    runs = tmp_path / "runs"
    res = cockpit("train", str(ROOT / "presets" / "cpu-demo.yaml"), "--set", "quantization_bit=4", "--set", "max_steps=3",
                  "--set", "use_cpu=true", "--set", "probes=null", "--runs-dir", str(runs), timeout=1200)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run,) = runs.iterdir()
    assert [e["step"] for e in read_events(run) if e["kind"] == "step"] == [1, 2, 3]
    assert "quantization_bit: 4" in (run / "config.yaml").read_text()
    (rank,) = json.loads((run / "launch.json").read_text())["ranks"]
    assert rank["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(side_site.folder())

    out = tmp_path / "merged"
    res = cockpit("export", run.name, "--runs-dir", str(runs), "--merge", "--out", str(out), "--json", timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert any("QLoRA run" in n for n in json.loads(res.stdout)["notes"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    loaded = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_BNB, str(out)], env=env, capture_output=True,
                            text=True, timeout=600)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    seen = json.loads(loaded.stdout.strip().splitlines()[-1])
    assert seen["quantization_config"] is None and not seen["bnb_loaded"] and seen["answer"].strip(), seen
    assert seen["dtypes"] == ["torch.float32"], seen
