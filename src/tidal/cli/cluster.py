"""Cluster commands: ``tidal up``, ``status``, ``down``, ``nodes``."""

from __future__ import annotations

from typing import Any

import typer

from tidal.cli import listings
from tidal.cli.api import Api
from tidal.cli.formats import Format, emit, output_option, print_table
from tidal.cli.output import console


def register(app: typer.Typer) -> None:
    @app.command()
    def up(nodes: int = typer.Option(2, "--nodes", "-n", help="agents to start: node-1 … node-N"),
           devices_per_node: int = typer.Option(1, "--devices-per-node", "-d",
                                             help="virtual devices per node"),
           lease: float = typer.Option(5.0, help="seconds an agent's lease lasts (fencing)"),
           policy: str = typer.Option("singularity", help="scheduling policy: singularity | firstfit"),
           metrics_public: bool = typer.Option(False, "--metrics-public",
                                               help="serve GET /metrics without a token (a new cluster's control "
                                                    "plane; by default a scrape needs a token of role metrics)"),
           ) -> None:
        """Start a local cluster (control plane and agents in the background; state in TIDAL_HOME)."""
        from tidal.config import load_settings
        from tidal.control.localcluster import up as start
        from tidal.policy.registry import make_live_policy

        make_live_policy(policy)  # a name the control plane would refuse is refused here, with the valid ones

        settings = load_settings()
        with console.status("starting the cluster…"):
            st, started = start(settings, nodes=nodes, devices_per_node=devices_per_node, lease_s=lease,
                                policy=policy, metrics_public=metrics_public)
        what = ", ".join(started) if started else "nothing (already running)"
        console.print(f"cluster at [bold]{st.url}[/]; started {what}")
        console.print(f"dashboard at [bold]{st.url}/ui[/]", highlight=False)
        console.print(f"state in {settings.home}; user token in {settings.home}/tokens/user.token")

    @app.command()
    def status(output: Format = output_option()) -> None:
        """Show the local cluster's processes and nodes."""
        from tidal.config import load_settings
        from tidal.control.clusterfile import alive, load

        settings = load_settings()
        st = load(settings.home)
        if st is None:
            console.print("no local cluster (start one with `tidal up`)")
            raise typer.Exit(1)
        procs = [{"name": "control plane", "pid": st.server.pid, "alive": alive(st.server.pid)},
                 *({"name": name, "pid": p.pid, "alive": alive(p.pid)} for name, p in st.agents.items())]
        nodes: list[dict[str, Any]] = Api().get("/v1/nodes") if procs[0]["alive"] else []
        data = {"url": st.url, "processes": procs, "nodes": nodes}

        def table(wide: bool) -> None:
            console.print(f"control plane at {st.url}", highlight=False)
            print_table(procs, listings.PROCESSES.columns, wide)
            if procs[0]["alive"]:
                print_nodes(nodes, wide)

        emit(data, output, table)

    @app.command()
    def down() -> None:
        """Stop the local cluster (jobs' ranks stop with their agents; the database is kept)."""
        from tidal.config import load_settings
        from tidal.control.localcluster import down as stop

        stopped = stop(load_settings())
        console.print("stopped " + (", ".join(stopped) if stopped else "nothing (no cluster running)"))

    @app.command()
    def nodes(output: Format = output_option()) -> None:
        """List the nodes, their devices and leases; GPU devices (model, memory, jobs) in a table of their own;
        with -o wide, the links between regions measured from the checkpoints copied over them too."""
        api = Api()
        rows: list[dict[str, Any]] = api.get("/v1/nodes")

        def table(wide: bool) -> None:
            print_nodes(rows, wide)
            links: list[dict[str, Any]] = api.get("/v1/links") if wide else []
            if links:
                console.print()
                print_table(links, listings.NODE_LINKS.columns, wide, title="Links between regions (measured)")

        emit(rows, output, table)


def print_nodes(rows: list[dict[str, Any]], wide: bool) -> None:
    """The nodes' table and, where nodes offer GPUs, their GPU devices' (unchanged for CPU nodes: one table)."""
    print_table(rows, listings.NODES.columns, wide)
    gpus = listings.gpu_rows(rows)
    if gpus:
        console.print()
        print_table(gpus, listings.NODE_GPUS.columns, wide, title="GPU devices")
