"""Experiment trackers (``report_to``: tensorboard, wandb, mlflow, trackio, swanlab; LLaMA-Factory's
``use_swanlab`` / ``swanlab_*``; HF's ``project``): the config's rules and refusals, secrets kept out of
the run dir, and a real training run whose losses each tracker logged, read back through the tracker's
own reader, equal the run's events.jsonl losses. The trackers live off the suite's sys.path, in
``<venv>/trackers-site`` (the README's install): the runs are the plain ``cockpit train``, whose launch puts
that folder on the ranks' PYTHONPATH because report_to names a tracker (cockpit/side_site.py); only the
readers, in subprocesses, take the ``trackers_env`` fixture."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cockpit, read_events, tiny_config


@pytest.fixture
def every_module_installed(monkeypatch):
    """The config rules alone: the trackers count as installed (they are off this process's sys.path)."""
    import cockpit.config.parity as parity

    monkeypatch.setattr(parity, "has_module", lambda name: True)


def checked(**over):
    from cockpit.config import validate

    return validate({"dataset": "cockpit_identity", **over}, check_paths=False)


def refused(match: str, **over):
    from cockpit.errors import InputError

    with pytest.raises(InputError, match=match):
        checked(**over)


# -- the config ---------------------------------------------------------------------------------------
def test_report_to_takes_one_tracker_or_a_list_as_hf_does(every_module_installed):
    from cockpit.config.trackers import trackers

    def on(cfg):
        return trackers(cfg.report_to, cfg.use_swanlab)

    assert checked().report_to == "none" and on(checked()) == []
    assert checked(report_to="wandb").report_to == "wandb"
    assert checked(report_to=["TensorBoard", "wandb", "wandb"]).report_to == "tensorboard,wandb"
    assert checked(report_to="mlflow, trackio").report_to == "mlflow,trackio"  # --set report_to=mlflow,trackio
    assert checked(report_to="[swanlab]").report_to == "swanlab"
    assert checked(report_to=[]).report_to == "none"
    assert on(checked(report_to="wandb", use_swanlab=True)) == ["wandb", "swanlab"]  # LLaMA-Factory's switch
    assert on(checked(report_to="swanlab", use_swanlab=True)) == ["swanlab"]  # once, as LLaMA-Factory drops HF's


def test_report_to_refuses_what_it_does_not_log_to(every_module_installed):
    refused(r"report_to: .*got all \('all' is not taken: name the trackers\)", report_to="all")
    refused("report_to: must be one or a list of none | tensorboard | wandb | mlflow | trackio | swanlab, got comet_ml",
            report_to=["wandb", "comet_ml"])
    refused(r"report_to: none with other names \(wandb\)", report_to=["none", "wandb"])
    refused("report_to: must be .*got 3", report_to=3)


def test_a_tracker_that_is_not_installed_is_named_with_the_extra(monkeypatch):
    import cockpit.config.parity as parity

    monkeypatch.setattr(parity, "has_module", lambda name: name != "mlflow")
    refused(r"report_to: mlflow is not installed here \(neither on sys.path nor in .*trackers-site\): "
            r"pip install 'cockpit-tune\[trackers\]'", report_to="wandb,mlflow")
    monkeypatch.setattr(parity, "has_module", lambda name: name != "swanlab")
    refused("use_swanlab: swanlab is not installed here", use_swanlab=True)


def test_a_trackers_own_keys_need_that_tracker(every_module_installed):
    refused("project: project names the Trackio project, and report_to has no trackio", project="mine")
    assert checked(report_to="trackio", project="mine").project == "mine"
    for key, value in (("swanlab_project", "p"), ("swanlab_workspace", "w"), ("swanlab_run_name", "r"),
                       ("swanlab_mode", "offline"), ("swanlab_logdir", "logs"), ("swanlab_api_key", "k")):
        refused(f"{key}: {key} applies to SwanLab: add swanlab to report_to", **{key: value})
        assert checked(report_to="swanlab", **{key: value})
    assert checked(swanlab_project="llamafactory")  # LLaMA-Factory's default written out: fine
    refused("swanlab_mode: must be one of offline | local | cloud | disabled", use_swanlab=True, swanlab_mode="online")


def test_tracker_keys_cockpit_does_not_build_are_refused_with_the_alternative():
    refused("swanlab_lark_webhook_url: .*Lark .*notify_command", swanlab_lark_webhook_url="https://x")
    refused("swanlab_lark_secret: .*Lark", swanlab_lark_secret="s")
    refused(r"trackio_space_id: .*trackio logs locally \(RUN_DIR/trackers/trackio", trackio_space_id="me/space")
    refused("trackio_bucket_id: .*Space or bucket is not supported", trackio_bucket_id="b")


def test_swanlab_api_key_goes_to_env_and_is_redacted_in_the_resolved_config(every_module_installed):
    """LLaMA-Factory's swanlab_api_key is passed as env SWANLAB_API_KEY (the name swanlab's login reads): the
    resolved config.yaml shows it, and WANDB_API_KEY, redacted; a second, different value is refused."""
    import yaml

    from cockpit.config.load import dump_resolved

    cfg = checked(use_swanlab=True, swanlab_api_key="sk-swan", env={"WANDB_API_KEY": "wb-key"}, report_to="wandb")
    assert cfg.swanlab_api_key is None and cfg.env == {"WANDB_API_KEY": "wb-key", "SWANLAB_API_KEY": "sk-swan"}
    text = dump_resolved(cfg)
    assert "sk-swan" not in text and "wb-key" not in text
    written = yaml.safe_load(text)
    assert written["env"] == {"WANDB_API_KEY": "***redacted***", "SWANLAB_API_KEY": "***redacted***"}
    again = checked(use_swanlab=True, report_to=written["report_to"], env=written["env"])  # the run dir's, re-read
    assert again.env["SWANLAB_API_KEY"] == "***redacted***" and again.swanlab_api_key is None
    refused("swanlab_api_key: env: SWANLAB_API_KEY is set too, to another value", use_swanlab=True,
            swanlab_api_key="a", env={"SWANLAB_API_KEY": "b"})


def test_the_ranks_tracker_variables_default_into_the_run_dir_and_the_users_win(tmp_path, monkeypatch,
                                                                              every_module_installed):
    from cockpit.train.trackers import report_to, tracker_environment

    cfg = checked(report_to="tensorboard,wandb,mlflow,trackio,swanlab")
    where = tmp_path / "run" / "trackers"
    assert tracker_environment(cfg, where) == {
        "TENSORBOARD_LOGGING_DIR": str(where / "tensorboard"),
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(where),
        "MLFLOW_TRACKING_URI": f"sqlite:///{where}/mlflow.db",
        "TRACKIO_DIR": str(where / "trackio"),
    }
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in tracker_environment(cfg, where)})
    os.environ["WANDB_MODE"] = "online"  # the user's env: (the ranks inherit it)
    assert report_to(cfg, where) == ["tensorboard", "wandb", "mlflow", "trackio"]  # swanlab: its own callback
    assert os.environ["WANDB_MODE"] == "online" and os.environ["TRACKIO_DIR"] == str(where / "trackio")
    assert where.is_dir() and tracker_environment(checked(), where) == {}


# -- a real run, read back through each tracker's own reader -------------------------------------------
READERS = {
    "tensorboard": """
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(os.path.join(sys.argv[1], "tensorboard")); acc.Reload()
out = [(e.step, e.value) for e in acc.Scalars("train/loss")]
""",
    "wandb": """
import glob, subprocess
found = glob.glob(os.path.join(sys.argv[1], "wandb", "offline-run-*", "run-*.wandb"))
assert len(found) == 1, found
lines = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", found[0]], check=True,
                       capture_output=True, text=True).stdout.splitlines()
items = [json.loads(l)["history"]["item"] for l in lines if l.startswith("{") and '"type":"history"' in l]
out = [(i["train/global_step"], i["train/loss"]) for i in items if "train/loss" in i]
""",
    "mlflow": """
from mlflow.tracking import MlflowClient
client = MlflowClient(tracking_uri="sqlite:///" + os.path.join(sys.argv[1], "mlflow.db"))
runs = client.search_runs(experiment_ids=["0"])
assert len(runs) == 1 and runs[0].info.run_name == sys.argv[2], [r.info.run_name for r in runs]
out = [(m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, "loss")]
""",
    "trackio": """
os.environ["TRACKIO_DIR"] = os.path.join(sys.argv[1], "trackio")
from trackio.sqlite_storage import SQLiteStorage
logs = SQLiteStorage.get_logs("cockpit-test", run=sys.argv[2])
out = [(l["train/global_step"], l["train/loss"]) for l in logs if "train/loss" in l]
""",
    "swanlab": """
import glob
from swanlab.proto.swanlab.record.v1.record_pb2 import Record
from swanlab.sdk.internal.core_python.store import DataStoreReader
found = glob.glob(os.path.join(sys.argv[1], "swanlog", "run-*", "run-*.swanlab"))
assert len(found) == 1, found
reader = DataStoreReader(); reader.open(found[0])
records = [Record.FromString(b) for b in reader]
start = [r.start for r in records if r.HasField("start")][0]
assert start.project == "cockpit-test" and start.name == sys.argv[2], start
out = [(r.scalar.step, r.scalar.value.number) for r in records if r.HasField("scalar") and r.scalar.key == "train/loss"]
""",
}


def read_back(tracker: str, trackers_dir: Path, run_id: str, env: dict) -> list[tuple[int, float]]:
    """(step, loss) as the tracker's own reader gives them, in a subprocess that can import it."""
    code = "import json, os, sys\n" + READERS[tracker] + "\nprint(json.dumps(out))\n"
    res = subprocess.run([sys.executable, "-c", code, str(trackers_dir), run_id], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [(int(s), float(v)) for s, v in json.loads(res.stdout.strip().splitlines()[-1])]


SECRETS = {"WANDB_API_KEY": "wandb-test-key-never-written", "swanlab_api_key": "swanlab-test-key-never-written"}


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, tiny_model_dir, trackers_env):
    """One few-step LoRA SFT run logging to every tracker: report_to's list and LLaMA-Factory's use_swanlab
    with its keys; API keys set (offline modes never use them). Its run dir and wall time."""
    import time

    tmp = tmp_path_factory.mktemp("trackers")
    cfg = tiny_config(tmp, tiny_model_dir, max_steps=4, probes=None, save_steps=100,
                      report_to=["tensorboard", "wandb", "mlflow", "trackio"], project="cockpit-test",
                      use_swanlab=True, swanlab_project="cockpit-test", swanlab_api_key=SECRETS["swanlab_api_key"],
                      env={"WANDB_API_KEY": SECRETS["WANDB_API_KEY"]})
    began = time.monotonic()
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp / "runs"), timeout=900)  # no test-only path
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run_dir,) = (tmp / "runs").iterdir()
    assert_trackers_site_on_the_ranks_path(run_dir)
    return run_dir, time.monotonic() - began


def assert_trackers_site_on_the_ranks_path(run_dir: Path) -> None:
    """The launch gave the rank <venv>/trackers-site (the suite's own process has no tracker on its path)."""
    from cockpit import side_site

    assert not side_site._on_path("wandb")
    (rank,) = json.loads((run_dir / "launch.json").read_text())["ranks"]
    assert rank["env"]["PYTHONPATH"].split(os.pathsep)[0] == str(side_site.folder(site="trackers"))


def event_losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(e["step"], e["loss"]) for e in read_events(run_dir) if e["kind"] == "step"]


@pytest.mark.slow
@pytest.mark.parametrize("tracker", ["tensorboard", "wandb", "mlflow", "trackio", "swanlab"])
def test_each_tracker_logged_the_runs_losses(tracked_run, trackers_env, tracker):
    """The tracker's own record of train loss, step by step, is the run's events.jsonl: the same floats."""
    run_dir, _ = tracked_run
    expected = event_losses(run_dir)
    assert [s for s, _ in expected] == [1, 2, 3, 4]
    logged = read_back(tracker, run_dir / "trackers", run_dir.name, trackers_env)
    assert logged == expected


@pytest.mark.slow
def test_the_trackers_files_are_in_the_run_dir_and_hold_no_secret(tracked_run):
    """Everything the trackers wrote is under RUN_DIR/trackers (cockpit rm removes it with the run), and no
    file of the run dir holds either API key."""
    run_dir, seconds = tracked_run
    print(f"\n[trackers] the 4-step run with 5 trackers took {seconds:.0f} s")
    trackers_dir = run_dir / "trackers"
    assert {p.name for p in trackers_dir.iterdir()} >= {"tensorboard", "wandb", "mlflow.db", "trackio", "swanlog"}
    for path in run_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not any(secret.encode() in data for secret in SECRETS.values()), path
    written = (run_dir / "config.yaml").read_text()
    assert "SWANLAB_API_KEY: '***redacted***'" in written and "WANDB_API_KEY: '***redacted***'" in written


@pytest.mark.slow
def test_a_trl_stage_logs_to_the_trackers_too(tmp_path, tiny_model_dir, trackers_env):
    """The other stages' path (TRL's DPOTrainer through stage_arguments and start_stage): report_to's mlflow
    and swanlab (report_to's name this time, no use_swanlab) log the run's DPO losses."""
    cfg = tiny_config(tmp_path, tiny_model_dir, "dpo", stage="dpo", dataset="cockpit_identity_pairs", max_steps=2,
                      probes=None, save_steps=100, report_to="mlflow,swanlab", swanlab_project="cockpit-test")
    res = cockpit("train", str(cfg), "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert_trackers_site_on_the_ranks_path(run_dir)
    expected = event_losses(run_dir)
    assert [s for s, _ in expected] == [1, 2]
    for tracker in ("mlflow", "swanlab"):
        assert read_back(tracker, run_dir / "trackers", run_dir.name, trackers_env) == expected, tracker


@pytest.mark.slow  # three processes importing swanlab: ~80 s on the loaded box
def test_swanlabs_own_callback_gets_llamafactorys_keys(tmp_path, trackers_env, every_module_installed):
    """use_swanlab's callback is SwanLab's transformers integration with the swanlab_* keys as LLaMA-Factory
    passes them; its mode: swanlab_mode, else SWANLAB_MODE from env:, else offline (never a login prompt)."""
    cases = [
        ({"use_swanlab": True}, {}, {"project": "llamafactory", "experiment_name": "run-1", "mode": "offline",
                                     "log_dir": str(tmp_path / "swanlog")}),
        ({"report_to": "swanlab"}, {"SWANLAB_MODE": "local"}, {"mode": "local"}),
        ({"use_swanlab": True, "swanlab_project": "p", "swanlab_workspace": "team", "swanlab_run_name": "mine",
          "swanlab_mode": "cloud", "swanlab_logdir": str(tmp_path / "elsewhere")}, {"SWANLAB_MODE": "local"},
         {"project": "p", "workspace": "team", "experiment_name": "mine", "mode": "cloud",
          "log_dir": str(tmp_path / "elsewhere")}),
    ]
    code = (
        "import json, sys\nfrom pathlib import Path\nfrom cockpit.config.run_config import RunConfig\n"
        "from cockpit.train.trackers import tracker_callbacks\n"
        "(cb,) = tracker_callbacks(RunConfig.from_mapping(json.loads(sys.argv[1])), Path(sys.argv[2]), 'run-1')\n"
        "print(type(cb).__module__, json.dumps(cb._init_kwargs))\n"
    )
    for keys, env, expected in cases:
        cfg = checked(**keys).mapping()
        res = subprocess.run([sys.executable, "-c", code, json.dumps(cfg), str(tmp_path)], capture_output=True,
                             text=True, env={**os.environ, **trackers_env, **env}, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        module, kwargs = res.stdout.strip().splitlines()[-1].split(" ", 1)
        assert module == "swanlab.integration.transformers"
        assert json.loads(kwargs).items() >= expected.items(), (keys, kwargs)
