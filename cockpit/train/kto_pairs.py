"""KTO's KL pairs built over the whole dataset, as LLaMA-Factory builds them, so that one sample
per micro-batch trains (LLaMA-Factory's own ``qwen3_lora_kto.yaml`` sets 1).

KTO estimates its KL term from mismatched (prompt, answer) pairs. TRL's KTOTrainer builds them by
rotating the answers within each slice of ``per_device_train_batch_size`` rows (so it refuses a
batch of 1: the "other" answer would be the row's own). LLaMA-Factory 0.9.5 rotates them in
preprocessing, over the rows of the dataset (``processor/feedback.py``: ``kl_response =
[responses[-1]] + responses[:-1]``), and its trainer reads them whatever the batch size. Here TRL's
KTOTrainer does everything else (tokenising, the KL forward passes, the loss, the metrics); only its
``KL_completion_ids`` column is rebuilt, over the whole dataset, and its batch-size refusal passed.
"""

from __future__ import annotations

from typing import Any, TypeVar

from trl import KTOTrainer

T = TypeVar("T")


def kl_rotation(completions: list[T]) -> list[T]:
    """Each row's KL completion: the previous row's answer (row 0: the last row's), LLaMA-Factory's
    +1 offset. With one row the row gets its own (``cockpit check`` refuses a KTO dataset of one row)."""
    return completions[-1:] + completions[:-1]


class DatasetKLTrainer(KTOTrainer):  # type: ignore[misc]  # TRL's KTOTrainer is Any here (follow_imports = skip)
    """TRL's KTOTrainer with LLaMA-Factory's KL pairs, at any ``per_device_train_batch_size``."""

    _one_per_batch = False  # per_device_train_batch_size 1: raised past TRL's check, put back before tokenising

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        targs = kwargs["args"]
        self._one_per_batch = targs.per_device_train_batch_size == 1
        if self._one_per_batch:
            # TRL refuses 1 because its in-batch rotation would pair a row with itself; the pairs here
            # are built over the dataset, so the check does not apply. _prepare_dataset puts 1 back.
            targs.per_device_train_batch_size = 2
        try:
            super().__init__(*args, **kwargs)
        finally:
            if self._one_per_batch:
                targs.per_device_train_batch_size = 1
        self._train_batch_size = targs.train_batch_size  # HF Trainer's copy, taken in its __init__

    def _prepare_dataset(self, dataset: Any, processing_class: Any, args: Any, dataset_name: str) -> Any:
        if self._one_per_batch:
            args.per_device_train_batch_size = 1  # TRL's check is behind: the rest of the run sees the real size
        dataset = super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        if not self.calculate_KL or not hasattr(dataset, "column_names"):  # an IterableDataset: TRL's own pairs
            return dataset
        kl = kl_rotation(list(dataset["completion_ids"]))
        return dataset.remove_columns("KL_completion_ids").add_column("KL_completion_ids", kl)
