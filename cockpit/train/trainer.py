"""HF Trainer with atomic checkpoints.

The stock Trainer writes ``checkpoint-N`` in place, so a crash (or a full disk) in the middle
of a save leaves a folder that looks like a checkpoint. Here every checkpoint is written under
``<output_dir>/.staging/`` and renamed into place only when complete; ``last_checkpoint()``
never looks in ``.staging``. A failed save removes its staging folder and raises
:class:`CheckpointError` with a clear reason; older checkpoints are untouched.
"""

from __future__ import annotations

import errno
import os
import shutil

from transformers import Trainer
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

STAGING = ".staging"


class CheckpointError(RuntimeError):
    pass


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _disk_full(exc: BaseException, folder: str) -> bool:
    """ENOSPC anywhere in the chain, or (torch's zip writer hides errno) almost no space left."""
    e: BaseException | None = exc
    while e is not None:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            return True
        e = e.__cause__ or e.__context__
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return False
    return usage.free < max(16 * 2**20, usage.total // 100)


class CockpitTrainer(Trainer):
    _staging = False

    def _get_output_dir(self, trial):
        root = super()._get_output_dir(trial)
        return os.path.join(root, STAGING) if self._staging else root

    def _save_checkpoint(self, model, trial) -> None:
        final_root = super()._get_output_dir(trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        staged = os.path.join(final_root, STAGING, name)
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # rotate after the rename
        self._staging = True
        try:
            super()._save_checkpoint(model, trial)
        except Exception as exc:  # torch.save reports ENOSPC as "RuntimeError: unexpected pos"
            full = _disk_full(exc, final_root)
            shutil.rmtree(staged, ignore_errors=True)
            if full:
                raise CheckpointError(
                    f"disk full while saving {name} in {final_root}; older checkpoints are intact; "
                    "free space, use another output_dir, or set save_total_limit"
                ) from exc
            raise CheckpointError(f"saving {name} failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._staging = False
            self.args.save_total_limit = limit
        _barrier()
        if self.args.should_save:
            target = os.path.join(final_root, name)
            if os.path.exists(target):  # a re-save of the same step (e.g. save-now at a save step)
                shutil.rmtree(target)
            os.replace(staged, target)
            try:
                os.rmdir(os.path.dirname(staged))  # leave no empty .staging behind
            except OSError:
                pass
            rotate_checkpoints(output_dir=final_root, save_total_limit=limit)
        _barrier()
