"""What the commands that talk to the control plane import, run against a real one: `tidal ls` its module and the
client alone (no HTTP library, no pydantic, no rich into a pipe, nothing of the server), and none of the hot
commands anything of the server's or of the settings'. Held as sets of modules, never as seconds (the seconds
are benchmarks/cli_startup.py's, in docs/cluster.md)."""

from __future__ import annotations

from tests.integration.cli.conftest import Served
from tidal.testing.control import FakeAgent, checkpoint_result
from tidal.testing.imports import imports_of

# What a command that talks to the control plane must never import: an HTTP library, the server's and the
# database's packages, the settings (pydantic-settings), the scheduler's, the agent's and the mechanisms'.
NEVER = ("httpx", "httpcore", "h11", "anyio", "sqlalchemy", "alembic", "fastapi", "starlette", "uvicorn",
         "pydantic_settings", "prometheus_client", "cryptography", "zstandard", "fsspec", "tidal.config",
         "tidal.control.api", "tidal.control.store", "tidal.control.server", "tidal.control.localcluster",
         "tidal.policy", "tidal.sim", "tidal.agent", "tidal.mechanisms")
# `tidal ls`, into a pipe: all of Tidal it imports.
LS_TIDAL = {"tidal", "tidal.errors", "tidal.proxies", "tidal.tls", "tidal.cli", "tidal.cli.api", "tidal.cli.coercion",
            "tidal.cli.completion", "tidal.cli.config", "tidal.cli.formats", "tidal.cli.jobs", "tidal.cli.listings",
            "tidal.cli.logs", "tidal.cli.output", "tidal.cli.root", "tidal.cli.selection", "tidal.cli.terms",
            "tidal.cli.units", "tidal.cli.version", "tidal.control", "tidal.control.client",
            "tidal.control.clusterfile"}


def among(modules: set[str], packages: tuple[str, ...]) -> set[str]:
    return {m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)}


def imported(s: Served, *args: str, expect: int = 0) -> set[str]:
    return imports_of("tidal.cli.main", *args, env=s.env, expect=expect)


def test_ls_imports_its_module_and_the_client_alone(served_plane: Served) -> None:
    served_plane.plane.submit(name="train")
    assert "train" in served_plane.cli("ls").stdout  # what is measured below works
    for args in (("ls",), ("ls", "-o", "json"), ("ls", "--all")):
        modules = imported(served_plane, *args)
        assert {m for m in modules if m.split(".")[0] == "tidal"} == LS_TIDAL, args
        # Typer, for the command line; not pydantic (tidal.cli.coercion), rich (into a pipe), YAML, the core.
        assert among(modules, ("pydantic", "pydantic_core", "rich", "yaml", "tidal.core", *NEVER)) == set(), args
    assert among(imported(served_plane, "ls", "-o", "yaml"), ("yaml",))  # YAML, where it is asked for


def test_the_hot_commands_import_nothing_of_the_server(served_plane: Served) -> None:
    p = served_plane.plane
    a = FakeAgent(p, "node-1", "A", devices=1)
    a.register()
    jid = p.submit(name="train")
    p.rec.once()
    (act,) = a.actions()
    assert a.result(act, ranks=[{"rank": 0, "pid": 11}])
    s = served_plane
    for args in (("show", jid), ("show", jid, "-o", "json"), ("logs", jid), ("submit", "-q", "--", "true"),
                 ("preempt", jid, "--no-wait")):
        assert among(imported(s, *args), NEVER) == set(), args
    (act,) = a.actions()  # the preempt's checkpoint, taken
    assert a.result(act, **checkpoint_result(act["payload"]["checkpoint_id"]))
    for args in (("resume", jid, "--no-wait"), ("cancel", jid)):
        assert among(imported(s, *args), NEVER) == set(), args
    assert among(imported(s, "wait", jid, expect=130), NEVER) == set()  # 130: it was cancelled
    assert p.job(jid)["state"] == "cancelled"  # every one of them did what it was run for
