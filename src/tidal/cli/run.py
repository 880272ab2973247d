"""``tidal run -- CMD ...``: run a command as checkpointable ranks inside a Slurm job (see docs/slurm.md).

Thin: the options are read here; :mod:`tidal.mechanisms.slurm.runner` does the work in this process."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    @app.command("run", context_settings={"allow_extra_args": False})
    def run_command(
        argv: list[str] = typer.Argument(None, metavar="-- CMD ...", help="the command to run, after --"),
        store: str = typer.Option(None, "--store", metavar="URL",
                                  help="the checkpoint store: a directory every node mounts at the same path, or "
                                       "s3://bucket/prefix (over TIDAL_CHECKPOINT_STORE)"),
        key: str = typer.Option(None, "--key", metavar="KEY",
                                help="the job's checkpoints in the store (default: the Slurm job id)"),
        checkpoint_every: float = typer.Option(None, "--checkpoint-every", metavar="SECONDS",
                                               help="also checkpoint every SECONDS, so that a job Slurm restarts "
                                                    "after a node failure goes on from there"),
        ranks_per_node: int = typer.Option(1, "--ranks-per-node", metavar="K",
                                           help="ranks to run on this node, with torchrun's environment"),
    ) -> None:
        """Run CMD as Tidal ranks inside a Slurm job: checkpointed into the store at Slurm's warning signal
        (SIGUSR1 of `--signal=B:USR1@SECONDS`, or SIGTERM on preemption), restored from the last checkpoint when
        Slurm starts the job again. Over several nodes, one task per node (`srun --ntasks-per-node=1 tidal run
        --ranks-per-node K -- CMD`): task 0 coordinates the checkpoint over the network. See docs/slurm.md."""
        from tidal.mechanisms.slurm.runner import RunOptions, run  # here: the rest of tidal's commands need none of it

        code = run(RunOptions(tuple(argv or ()), store=store, key=key, checkpoint_every=checkpoint_every,
                              ranks_per_node=ranks_per_node))
        raise typer.Exit(code)
