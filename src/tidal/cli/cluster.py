"""Cluster commands: ``tidal up``, ``status``, ``down``, ``nodes``."""

from __future__ import annotations

import typer
from rich.table import Table

from tidal.cli.output import console
from tidal.config import load_settings
from tidal.control.client import Client


def register(app: typer.Typer) -> None:
    @app.command()
    def up(nodes: int = typer.Option(2, "--nodes", "-n", help="agents to start: node-1 … node-N"),
           devices_per_node: int = typer.Option(1, "--devices-per-node", "-d",
                                             help="virtual devices per node"),
           lease: float = typer.Option(5.0, help="seconds an agent's lease lasts (fencing)"),
           policy: str = typer.Option("singularity", help="scheduling policy: singularity | firstfit")) -> None:
        """Start a local cluster (control plane and agents in the background; state in TIDAL_HOME)."""
        from tidal.control.localcluster import up as start
        from tidal.policy.registry import make_live_policy

        make_live_policy(policy)  # a name the control plane would refuse is refused here, with the valid ones

        settings = load_settings()
        with console.status("starting the cluster…"):
            st, started = start(settings, nodes=nodes, devices_per_node=devices_per_node, lease_s=lease,
                                policy=policy)
        what = ", ".join(started) if started else "nothing (already running)"
        console.print(f"cluster at [bold]{st.url}[/]; started {what}")
        console.print(f"state in {settings.home}; user token in {settings.home}/tokens/user.token")

    @app.command()
    def status() -> None:
        """Show the local cluster's processes and nodes."""
        from tidal.control.clusterfile import alive, load

        settings = load_settings()
        st = load(settings.home)
        if st is None:
            console.print("no local cluster (start one with `tidal up`)")
            raise typer.Exit(1)
        t = Table("process", "pid", "alive")
        t.add_row("control plane", str(st.server.pid), "yes" if alive(st.server.pid) else "[red]no[/]")
        for name, p in st.agents.items():
            t.add_row(name, str(p.pid), "yes" if alive(p.pid) else "[red]no[/]")
        console.print(f"control plane at {st.url}")
        console.print(t)
        if alive(st.server.pid):
            _nodes_table(Client())

    @app.command()
    def down() -> None:
        """Stop the local cluster (jobs' ranks stop with their agents; the database is kept)."""
        from tidal.control.localcluster import down as stop

        stopped = stop(load_settings())
        console.print("stopped " + (", ".join(stopped) if stopped else "nothing (no cluster running)"))

    @app.command()
    def nodes() -> None:
        """List the nodes, their devices and leases."""
        _nodes_table(Client())


def _nodes_table(api: Client) -> None:
    t = Table("node", "address", "region/cluster", "devices", "free", "up", "lease left")
    for n in api.get("/v1/nodes"):
        t.add_row(n["name"], n.get("address") or "-", f"{n['region']}/{n['cluster']}", str(n["devices"]),
                  str(n["free"]), "yes" if n["up"] else "[red]no[/]", f"{n['lease_left_s']}s")
    console.print(t)
