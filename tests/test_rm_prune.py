"""``cockpit rm`` / ``cockpit prune`` and the global ``--runs-dir`` (issue 29, item 4).

Runs are made as the contract has them (run dir, status.json) without training: the state is what
these commands read. An active run's supervisor is this test process (alive, with its start time)."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from cockpit import cli
from cockpit.run.liveness import start_time
from cockpit.store.rundir import RunDir, create_run_dir


def make_run(root: Path, name: str, state: str, *, ended_days_ago: float = 0.0, output_dir: Path | None = None) -> RunDir:
    run = create_run_dir(root, name)
    fields: dict = {"state": state, "run_id": run.run_id, "attempt": 1, "started": time.time() - 86400 * ended_days_ago - 60}
    if state in ("starting", "running", "stopping"):
        fields.update(supervisor_pid=os.getpid(), supervisor_start=start_time(os.getpid()))
    else:
        fields["ended"] = time.time() - 86400 * ended_days_ago
    if output_dir is not None:
        fields["output_dir"] = str(output_dir)
    run.update_status(**fields)
    (run.path / "config.yaml").write_text("dataset: x\n")
    return run


def fill(folder: Path, mib: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(os.urandom(mib << 20))


def main_json(capsys, *argv: str) -> tuple[int, dict]:
    code = cli.main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out.strip().splitlines()[-1])


@pytest.fixture()
def no_terminal(monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))


# -- the global --runs-dir -----------------------------------------------------------------------
def test_global_runs_dir_is_the_commands_runs_dir_at_either_place(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    run = make_run(a, "one", "finished")
    make_run(b, "other", "failed")
    for argv in (["--runs-dir", str(a), "runs", "--json"], ["runs", "--runs-dir", str(a), "--json"]):
        assert cli.main(argv) == 0
        assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [run.run_id]
    same = ["--runs-dir", str(a), "runs", "--runs-dir", str(a) + "/", "--json"]
    assert cli.main(same) == 0
    assert [r["run_id"] for r in json.loads(capsys.readouterr().out)] == [run.run_id]


def test_global_runs_dir_refused_where_it_does_nothing_or_disagrees(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--runs-dir", str(tmp_path), "plan", "x.yaml"])
    assert exc.value.code == 2
    assert "--runs-dir does nothing for `cockpit plan`" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.parse_args(["--runs-dir", str(tmp_path / "a"), "runs", "--runs-dir", str(tmp_path / "b")])
    assert exc.value.code == 2
    assert "two runs dirs given" in capsys.readouterr().err


# -- rm ------------------------------------------------------------------------------------------
def test_rm_refuses_an_active_run_and_then_deletes_nothing(tmp_path, capsys, no_terminal):
    done = make_run(tmp_path, "done", "finished")
    live = make_run(tmp_path, "live", "running")
    code, out = main_json(capsys, "rm", done.run_id, live.run_id, "--runs-dir", str(tmp_path), "--yes", "--json")
    assert code == 2
    assert done.path.is_dir() and live.path.is_dir()
    assert out["deleted"] is False and out["freed_bytes"] == 0
    refused = {r["run_id"]: r["refused"] for r in out["runs"]}
    assert refused[done.run_id] is None
    assert f"cockpit stop {live.run_id}" in refused[live.run_id] and refused[live.run_id].startswith("running")


def test_rm_dry_run_reports_sizes_and_deletes_nothing(tmp_path, capsys):
    run = make_run(tmp_path, "demo", "finished")
    fill(run.path / "merged", 3)
    fill(run.path / "checkpoints" / "checkpoint-2", 1)
    code, out = main_json(capsys, "--runs-dir", str(tmp_path), "rm", run.run_id, "--dry-run", "--json")
    assert code == 0 and out["dry_run"] is True and out["deleted"] is False
    (row,) = out["runs"]
    assert row["parts"]["merged"] >= 3 << 20 and row["parts"]["checkpoints"] >= 1 << 20
    assert row["bytes"] >= 4 << 20 and row["deleted"] is False
    assert (run.path / "merged" / "model.safetensors").is_file()
    assert cli.main(["rm", run.run_id, "--runs-dir", str(tmp_path), "--dry-run"]) == 0
    text = capsys.readouterr().out
    assert "merged 3.0 MiB" in text and "nothing deleted" in text


def test_rm_deletes_the_run_dir_and_keeps_an_outside_output_dir_unless_asked(tmp_path, capsys, no_terminal):
    runs = tmp_path / "runs"
    out_dir = tmp_path / "user_out"
    fill(out_dir / "adapter", 2)
    first = make_run(runs, "first", "stopped", output_dir=out_dir)
    fill(first.path / "merged", 1)
    code, out = main_json(capsys, "rm", first.run_id, "--runs-dir", str(runs), "--yes", "--json")
    assert code == 0 and out["deleted"] is True
    assert not first.path.exists() and (out_dir / "adapter" / "model.safetensors").is_file()
    (row,) = out["runs"]
    assert row["output_dir"] == str(out_dir.resolve()) and row["output_dir_deleted"] is False
    assert "--with-output-dir" in row["output_dir_note"]
    assert out["freed_bytes"] == row["bytes"] >= 1 << 20

    second = make_run(runs, "second", "failed", output_dir=out_dir)
    code, out = main_json(capsys, "rm", second.run_id, "--runs-dir", str(runs), "--yes", "--with-output-dir", "--json")
    assert code == 0 and out["runs"][0]["output_dir_deleted"] is True
    assert not second.path.exists() and not out_dir.exists()


def test_rm_never_deletes_an_output_dir_that_holds_the_runs_dir(tmp_path, capsys, no_terminal):
    runs = tmp_path / "runs"
    run = make_run(runs, "wide", "finished", output_dir=tmp_path)
    code, out = main_json(capsys, "rm", run.run_id, "--runs-dir", str(runs), "--yes", "--with-output-dir", "--json")
    assert code == 0 and not run.path.exists() and runs.is_dir()
    assert out["runs"][0]["output_dir_deleted"] is False and "holds the runs dir" in out["runs"][0]["output_dir_note"]


def test_rm_never_offers_a_users_file_named_as_output_dir_and_counts_true(tmp_path, capsys, no_terminal):
    """Issue 50 item 3: output_dir naming the user's file: the dry run said "deleted too", the real one
    failed on it ("Not a directory") and said "deleted 0 run(s)" after deleting the run dir."""
    runs = tmp_path / "runs"
    users_file = tmp_path / "notes.txt"
    users_file.write_text("mine\n")
    run = make_run(runs, "filed", "finished", output_dir=users_file)
    argv = ["rm", run.run_id, "--runs-dir", str(runs), "--with-output-dir"]
    assert cli.main([*argv, "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert "deleted too" not in said and "not a folder" in said and "would delete 1 run(s)" in said
    assert cli.main([*argv, "--yes"]) == 0
    captured = capsys.readouterr()
    assert "deleted 1 run(s)" in captured.out and "could not delete" not in captured.err
    assert not run.path.exists() and users_file.read_text() == "mine\n"
    again = make_run(runs, "filed2", "finished", output_dir=users_file)
    code, out = main_json(capsys, *argv[:1], again.run_id, *argv[2:], "--yes", "--json")
    assert code == 0 and out["deleted"] is True and users_file.is_file()
    assert out["runs"][0]["output_dir_deleted"] is False and out["freed_bytes"] == out["runs"][0]["bytes"]


def test_rm_counts_a_deleted_run_whose_output_dir_could_not_go(tmp_path, capsys, no_terminal, monkeypatch):
    """The run dir went, the output_dir's deletion failed: the run is counted as deleted, the
    output_dir's failure said as such (exit 1), the freed bytes only the run dir's."""
    import shutil

    from cockpit.run import remove

    runs, out_dir = tmp_path / "runs", tmp_path / "user_out"
    fill(out_dir, 1)
    run = make_run(runs, "stuck", "finished", output_dir=out_dir)
    real_rmtree = shutil.rmtree

    def rmtree(path, *a, **kw):
        if Path(path) == out_dir.resolve():
            raise PermissionError(13, "Permission denied", str(path))
        return real_rmtree(path, *a, **kw)

    monkeypatch.setattr(remove.shutil, "rmtree", rmtree)
    assert cli.main(["rm", run.run_id, "--runs-dir", str(runs), "--with-output-dir", "--yes"]) == 1
    captured = capsys.readouterr()
    assert "deleted 1 run(s)" in captured.out and not run.path.exists() and out_dir.is_dir()
    assert f"deleted {run.run_id}, not its output_dir: Permission denied" in captured.err


def test_rm_asks_on_a_terminal_and_needs_yes_without_one(tmp_path, capsys, monkeypatch):
    run = make_run(tmp_path, "ask", "failed")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert cli.main(["rm", run.run_id, "--runs-dir", str(tmp_path)]) == 2
    assert "pass --yes" in capsys.readouterr().err and run.path.is_dir()

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty(""))
    asked: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "n")
    assert cli.main(["rm", run.run_id, "--runs-dir", str(tmp_path)]) == 1
    assert run.path.is_dir() and asked and asked[0].startswith("delete 1 run, freeing")
    monkeypatch.setattr("builtins.input", lambda prompt: "y")
    assert cli.main(["rm", run.run_id, "--runs-dir", str(tmp_path)]) == 0
    assert not run.path.exists()
    assert "deleted 1 run(s)" in capsys.readouterr().out


def test_rm_unknown_run_is_invalid_input(tmp_path, capsys):
    make_run(tmp_path, "known", "finished")
    assert cli.main(["rm", "nope", "--runs-dir", str(tmp_path), "--yes"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err


# -- prune ---------------------------------------------------------------------------------------
def test_prune_selects_by_state_and_age_and_never_an_active_run(tmp_path, capsys, no_terminal):
    old_failed = make_run(tmp_path, "old-failed", "failed", ended_days_ago=10)
    new_failed = make_run(tmp_path, "new-failed", "failed", ended_days_ago=0)
    old_lost = make_run(tmp_path, "old-lost", "lost", ended_days_ago=10)
    old_finished = make_run(tmp_path, "old-finished", "finished", ended_days_ago=10)
    old_stopped = make_run(tmp_path, "old-stopped", "stopped", ended_days_ago=10)
    live = make_run(tmp_path, "live", "running")

    code, out = main_json(capsys, "prune", "--runs-dir", str(tmp_path), "--older-than", "2", "--dry-run", "--json")
    assert code == 0 and out["dry_run"] is True
    assert sorted(r["run_id"] for r in out["runs"]) == sorted([old_failed.run_id, old_lost.run_id])
    assert all(r.path.is_dir() for r in (old_failed, new_failed, old_lost, old_finished, old_stopped, live))

    code, out = main_json(capsys, "prune", "--runs-dir", str(tmp_path), "--state", "finished", "--state", "failed", "--yes", "--json")
    assert code == 0 and out["deleted"] is True
    assert sorted(r["run_id"] for r in out["runs"]) == sorted([old_failed.run_id, new_failed.run_id, old_finished.run_id])
    assert not old_failed.path.exists() and not new_failed.path.exists() and not old_finished.path.exists()
    assert old_lost.path.is_dir() and old_stopped.path.is_dir() and live.path.is_dir()

    assert cli.main(["prune", "--runs-dir", str(tmp_path), "--state", "failed"]) == 0
    assert "nothing to prune" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["prune", "--runs-dir", str(tmp_path), "--state", "running"])
    assert exc.value.code == 2
