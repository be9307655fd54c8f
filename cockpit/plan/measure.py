"""Measure the real peak of live tensor bytes on CPU, for validating the planner.

How: a ``TorchDispatchMode`` sees every ATen op below autograd, including the backward ops the
autograd engine runs and the optimizer's ops. For every tensor an op returns we look at its
*storage* (views share one, so nothing is counted twice), add ``nbytes`` once, and hang a weakref
on the storage object whose callback subtracts it when the storage dies. PyTorch keeps one Python
object per live storage (PyObject preservation), so the callback fires when the memory is
really released, not when a Python wrapper goes away. Storages that existed before the mode was
entered (the model's weights) are registered with ``track_existing``.

What it cannot see: scratch memory a kernel allocates internally without returning it (e.g. the
blocked buffers inside the CPU flash-attention kernel), allocator rounding and fragmentation. On
CPU those are small; on GPUs the planner's runtime-overhead term stands for them.

Imports torch lazily (the module itself is importable without it).
"""

from __future__ import annotations

import weakref
from typing import Any


def _mode_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class LiveTensorBytes(TorchDispatchMode):
        """Tracks live storage bytes; ``peak`` is the high-water mark since the last ``reset_peak``."""

        def __init__(self) -> None:
            super().__init__()
            self.live = 0
            self.peak = 0
            self._sizes: dict[int, int] = {}
            self._refs: dict[int, Any] = {}

        def _free(self, key: int, _ref: Any) -> None:
            self.live -= self._sizes.pop(key, 0)
            self._refs.pop(key, None)

        def track(self, t: Any) -> None:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                return
            st = t.untyped_storage()
            key = st._cdata
            n = st.nbytes()
            old = self._sizes.get(key)
            if old is None:
                self._refs[key] = weakref.ref(st, lambda r, k=key: self._free(k, r))
                self._sizes[key] = n
                self.live += n
            elif old != n:  # resized in place
                self._sizes[key] = n
                self.live += n - old
            if self.live > self.peak:
                self.peak = self.live

        def track_existing(self, tensors: Any) -> None:
            for t in tensors:
                self.track(t)

        def reset_peak(self) -> None:
            self.peak = self.live

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            leaves, _ = tree_flatten(out)
            for t in leaves:
                self.track(t)
            # in-place / out= ops may resize an argument's storage
            if func._schema.is_mutable:
                for t in tree_flatten((args, kwargs))[0]:
                    if isinstance(t, torch.Tensor):
                        self.track(t)
            return out

    return LiveTensorBytes


def live_tensor_bytes():
    """A new ``LiveTensorBytes`` dispatch mode (use as a context manager)."""
    return _mode_class()()
