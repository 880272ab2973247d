"""Tidal under Slurm: ``tidal run`` runs a command as checkpointable ranks inside a Slurm job or step,
checkpoints them at the warning signal into the store, and restores them when Slurm starts the job again.
Slurm stays in charge of scheduling: :mod:`.step` reads what Slurm says about the step, :mod:`.runner`
drives the checkpoint mechanism (:mod:`tidal.mechanisms.criu.job`) over its ranks, :mod:`.site` checks a
site's Slurm configuration for ``tidal doctor --slurm``."""
