"""Host synchronisations per training step: what in a step makes the host wait for the device.

    python bench/host_syncs.py [--steps 8] [--device cpu|cuda] [--model NAME]

On a GPU, a call that reads a device tensor's value on the host (``.item()``, ``.tolist()``,
``.nonzero()`` whose output size depends on the data, ``bool(t)``, ``.cpu()``...) waits for every
kernel queued before it: the host stops running ahead of the GPU. This counts those calls in
training steps (after two warm-up steps) of the job of bench/step_overhead.py (LoRA r8, cutoff 256,
micro-batch 4, the embedded model and demo data), for a bare HF Trainer and for what a Cockpit rank
runs (CockpitTrainer, its collator, its callback writing events), and names the call sites.

``--device cpu`` (this machine): every such call is counted, since on a GPU the same tensors would
live on the device (the flags the callback agrees on are host tensors by design, on a gloo group
even under NCCL: ``train/callbacks.control_group``; their ``tolist`` is listed but costs no wait).
``--device cuda``: only calls on CUDA/HIP tensors are counted (``torch.cuda.set_sync_debug_mode``
would warn on the same ones). Counts, not times: the cost of a wait depends on the queue behind it.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SYNC_METHODS = ("item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu")


class SyncCounter:
    """Wraps the tensor methods that read a value on the host; counts calls by caller while ``on``."""

    def __init__(self, device: str):
        import torch

        self.torch = torch
        self.device = device
        self.on = False
        self.sites: collections.Counter[str] = collections.Counter()
        self.saved: dict[str, object] = {}
        torch_dir = os.path.dirname(torch.__file__)

        def caller() -> str:
            f = sys._getframe(2)
            while f is not None and f.f_code.co_filename.startswith(torch_dir):
                f = f.f_back
            if f is None:
                return "torch"
            name = f.f_globals.get("__name__", "?")
            return f"{name}:{f.f_code.co_name}:{f.f_lineno}"

        for method in SYNC_METHODS:
            original = getattr(torch.Tensor, method)
            self.saved[method] = original

            def wrapped(t, *a, _original=original, _method=method, **k):
                if self.on and (self.device == "cpu" or t.device.type == "cuda"):
                    self.sites[f"{_method} {caller()}"] += 1
                return _original(t, *a, **k)

            setattr(torch.Tensor, method, wrapped)

    def restore(self) -> None:
        for method, original in self.saved.items():
            setattr(self.torch.Tensor, method, original)


def count(trainer, counter: SyncCounter, warmup: int) -> tuple[int, collections.Counter]:
    from transformers import TrainerCallback

    steps = [0]

    class Window(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            counter.on = state.global_step >= warmup

        def on_step_end(self, args, state, control, **kw):
            if counter.on:
                steps[0] += 1
            counter.on = False

    counter.sites.clear()
    trainer.add_callback(Window())
    trainer.train()
    return steps[0], collections.Counter(counter.sites)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a model name or folder (the suite: a tiny random Llama)")
    a = ap.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import step_overhead

    from cockpit.data.prepare import prepare_dataset
    from cockpit.models.resolve import load_tokenizer, resolve_model

    job_args = argparse.Namespace(steps=a.steps + 2, fp32=a.device == "cpu", no_checkpointing=False, model=a.model)
    cfg = step_overhead.job(job_args)
    if a.device == "cuda":
        cfg = cfg.replace(use_cpu=False)
    ref = resolve_model(cfg.model_name_or_path)
    tok = load_tokenizer(cfg, ref)
    rows = [{"input_ids": r.input_ids, "labels": r.labels} for r in prepare_dataset(cfg, tok).rendered if r.target_kept > 0]
    print(f"job: LoRA r8 all-linear, cutoff {cfg.cutoff_len}, micro-batch 4, {a.steps} counted steps "
          f"(after 2), device {a.device}")
    counter = SyncCounter(a.device)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for variant in ("bare", "cockpit"):
                steps, sites = count(step_overhead.build(variant, cfg, ref, tok, rows, Path(tmp)), counter, warmup=2)
                total = sum(sites.values())
                print(f"\n{variant}: {total / max(steps, 1):.1f} host reads per step ({steps} steps)")
                for site, n in sites.most_common():
                    print(f"  {n / max(steps, 1):6.1f}/step  {site}")
    finally:
        counter.restore()


if __name__ == "__main__":
    main()
