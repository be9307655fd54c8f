"""Slurm: submit a run as a batch job, follow the job in the queue, stop or cancel it. No torch.

- ``script``: the ``#SBATCH`` header (GPU requests only when the config needs GPUs) and the job
  script that runs the cockpit supervisor for an existing run dir on each node;
- ``submit``: ``cockpit train CONFIG --slurm``: a new run dir in state ``queued`` with the job id;
- ``node``: what ``srun`` runs on each node of the allocation (``python -m cockpit.slurm.node``);
- ``queue``: ``squeue``/``sacct`` state and reason of a run's job, and the run state they imply
  (``effective_status``): queued, live, or ended by the scheduler;
- ``fs``: the filesystem type of a path (multi-node runs need the runs dir on a shared one).
"""
