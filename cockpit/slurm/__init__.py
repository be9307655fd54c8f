"""Talking to Slurm: the job script, the queue, the filesystem. No torch; imports only the run-dir
store (and errors / redaction), so the lifecycle (``cockpit.run``), the strategies' preview and
the commands can all ask it.

- ``script``: the ``#SBATCH`` header (GPU requests only when the config needs GPUs) and the job
  script that runs the cockpit supervisor for an existing run dir on each node;
- ``queue``: ``squeue``/``sacct`` state and reason of a run's job, and the run state they imply
  (``effective_status``): queued, live, or ended by the scheduler;
- ``fs``: the filesystem type of a path (multi-node runs need the runs dir on a shared one).

Submitting a run (``cockpit train CONFIG --slurm``) and what ``srun`` runs on each node are the
run's lifecycle: ``cockpit.run.slurm_submit`` and ``cockpit.run.slurm_node``.
"""
