"""Old checkpoints are retired atomically (renamed into .staging, then deleted), keeping HF's rule:
at most save_total_limit, always the newest and the best. A rank killed mid-delete once left a
checkpoint-3 without its trainer_state.json among the complete ones (the chaos test's trial 16)."""

from __future__ import annotations

import os
import shutil

from cockpit.store.rundir import CHECKPOINT_STAGING as STAGING
from cockpit.train.trainer import retire_old_checkpoints


def _checkpoints(root, steps):
    for s in steps:
        d = root / f"checkpoint-{s}"
        d.mkdir(parents=True)
        (d / "trainer_state.json").write_text("{}")
        (d / "model.safetensors").write_bytes(b"x" * 1000)


def test_keeps_the_newest_and_the_best_and_retires_through_staging(tmp_path, monkeypatch):
    _checkpoints(tmp_path, [3, 6, 9, 12, 15])
    moved = []
    real_replace = os.replace

    def watch(src, dst):
        moved.append((os.path.basename(src), os.path.relpath(dst, tmp_path)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", watch)
    retire_old_checkpoints(str(tmp_path), 2, str(tmp_path / "checkpoint-6"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-15", "checkpoint-6"]
    assert moved == [("checkpoint-3", f"{STAGING}/retired-checkpoint-3"), ("checkpoint-9", f"{STAGING}/retired-checkpoint-9"),
                     ("checkpoint-12", f"{STAGING}/retired-checkpoint-12")]


def test_a_kill_mid_delete_leaves_no_half_checkpoint_in_place(tmp_path, monkeypatch):
    _checkpoints(tmp_path, [3, 6, 9])

    def killed(path, ignore_errors=False):  # the process dies after deleting one file of the retired checkpoint
        if not os.path.exists(path):
            return
        os.remove(os.path.join(path, "trainer_state.json"))
        raise SystemExit("killed")

    monkeypatch.setattr(shutil, "rmtree", killed)
    try:
        retire_old_checkpoints(str(tmp_path), 2, None)
    except SystemExit:
        pass
    for ckpt in tmp_path.glob("checkpoint-*"):  # the chaos test's invariant
        assert (ckpt / "trainer_state.json").exists(), ckpt
    assert (tmp_path / STAGING / "retired-checkpoint-3").is_dir()  # the half-deleted one is out of the way
