"""Communication layer: what NCCL/RCCL is doing and how healthy the links are.

- ``nccl_log``: incremental parser of ``NCCL_DEBUG=INFO`` output and PyTorch's NCCL watchdog
  lines (supervisor side, no torch): :class:`~cockpit.comm.nccl_log.NcclLogParser`,
  :func:`~cockpit.comm.nccl_log.merge_snapshots` (fields of the ``comm`` event).
- ``env``: the NCCL_*/RCCL_*/HSA_*/TORCH_NCCL_* environment in effect (``comm_env``).
- ``health``: all-reduce probe and backend info, run inside the ranks (imports torch lazily).
"""
