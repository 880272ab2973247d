"""Job commands: submit, ls, show, logs, wait, cancel, checkpoints, events, preempt, resume, migrate."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
import yaml
from rich.markup import escape
from rich.table import Table

from tidal.cli import jobcheck, jobenv
from tidal.cli.api import Api
from tidal.cli.output import console, fail
from tidal.core import JobSpec
from tidal.errors import Conflict, TidalError, ValidationError

STABLE = {"running", "preempted", "held", "pending", "succeeded", "failed", "cancelled"}
TERMINAL = {"succeeded", "failed", "cancelled"}
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, field: str = "checkpoint_every") -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not m:
        raise ValidationError(f"{field}: bad duration {text!r}", field=field, hint="e.g. 30s, 5m, 1h")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S") if t else "-"


# How the CLI reads a field of a job, in a job file or from an option, where the API takes it otherwise:
# a command as one string is run by sh; a duration may have a unit.
_FORMS: dict[str, Callable[[Any], Any]] = {
    "command": lambda v: ["sh", "-c", v] if isinstance(v, str) else v,
    "checkpoint_every": lambda v: parse_duration(v) if isinstance(v, str) else v,
}
# The fields a submission may give (JobSpec's): the request's body is made of these.
SUBMITTED = frozenset(f.name for f in JobSpec.submission_fields())


def _as_submitted(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: _FORMS[k](v) if k in _FORMS else v for k, v in fields.items()}


def load_job_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ValidationError(f"cannot read job file {path}: {exc.strerror}", field="file",
                              hint="give the path of a readable job.yaml") from None
    except yaml.YAMLError as exc:
        raise ValidationError(f"job file {path} is not valid YAML: {exc}", field="file",
                              hint="fix the file where the parser points") from None
    if not isinstance(data, dict):
        raise ValidationError(f"job file {path} must hold a mapping of job fields", field="file",
                              hint="e.g. `command: python train.py` on a line of its own")
    jobcheck.check_file_keys(data, str(path))
    return _as_submitted(data)


def _submission(file: Path | None, options: dict[str, Any], env: list[str]) -> dict[str, Any]:
    """The body of `tidal submit`'s request: job.yaml's fields, then the options given (by field name)
    over them, then the job's environment (see :mod:`tidal.cli.jobenv`)."""
    assert set(options) <= SUBMITTED, set(options) - SUBMITTED
    given = {k: v for k, v in options.items() if v is not None and v != []}
    from_file: set[str] = set()
    try:
        body: dict[str, Any] = load_job_file(file) if file else {}
        from_file = set(body) - set(given)
        body.update(_as_submitted(given))
        if not body.get("command"):
            raise ValidationError("command: give the command after --, e.g. `tidal submit -- python train.py`",
                                  field="command", hint="or give `command:` in the job file (-f)")
        body["workdir"] = str(Path(body.get("workdir") or os.getcwd()).absolute())
        body["env"] = jobenv.job_env(os.environ, body.pop("env", None), env)
        jobcheck.check(body)
    except ValidationError as exc:  # in the user's terms: the flag or the job file's key they gave
        raise jobcheck.in_user_terms(exc, from_file, str(file) if file else None) from None
    return body


def wait_stable(api: Api, job_id: str, done: Any, timeout: float, what: str) -> dict[str, Any]:
    """Poll the job until ``done(job)``; a spinner meanwhile."""
    deadline = time.monotonic() + timeout
    with console.status(f"{what} {job_id}…"):
        while True:
            job: dict[str, Any] = api.get(f"/v1/jobs/{job_id}")
            if done(job):
                return job
            if time.monotonic() > deadline:
                raise TidalError(f"job {job_id} is still {job['state']} after {timeout:.0f}s",
                                 hint="it may still get there: `tidal show " + job_id + "`")
            time.sleep(0.05)


def _request(api: Api, job_id: str, verb: str, timeout: float, **kw: Any) -> dict[str, Any]:
    """POST the request, retrying while the job is busy (another checkpoint or a start in flight)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return api.post(f"/v1/jobs/{job_id}/{verb}", **kw)  # type: ignore[no-any-return]
        except Conflict as exc:
            if not exc.fields.get("busy") or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _since(job: dict[str, Any], seq: int) -> list[dict[str, Any]]:
    return [e for e in job["events"] if e["seq"] > seq]


def register(app: typer.Typer) -> None:
    _resize_cmd(app)
    @app.command(context_settings={"allow_interspersed_args": False})
    def submit(
        command: list[str] = typer.Argument(None, help="the command, after --"),
        name: str = typer.Option(None, "--name"),
        tier: str = typer.Option(None, "--tier", help="premium | standard | basic (default basic)"),
        project: str = typer.Option(None, "--project",
                                    help="the project whose quota admits premium and standard jobs (default: default)"),
        ranks: int = typer.Option(None, "--ranks", help="world size W"),
        min_devices: int = typer.Option(None, "--min-devices"),
        max_devices: int = typer.Option(None, "--max-devices"),
        checkpoint_every: str = typer.Option(None, "--checkpoint-every", help="e.g. 30s, 5m"),
        max_restarts: int = typer.Option(None, "--max-restarts"),
        workdir: Path = typer.Option(None, "--workdir", help="default: the current directory"),
        file: Path = typer.Option(None, "-f", "--file", help="a job.yaml"),
        env: list[str] = typer.Option(None, "--env", "-e", metavar="NAME[=VALUE]",
                                      help="set a variable in the job's environment (NAME alone: your value); "
                                           "repeatable"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the job id"),
    ) -> None:
        """Submit a job: `tidal submit [options] -- CMD ...`. Its environment: PATH, HOME, locale, Python
        and threading variables of yours (see docs/cluster.md), job.yaml's env and each --env."""
        try:
            body = _submission(file, {"command": command, "name": name, "tier": tier, "project": project,
                                      "ranks": ranks, "min_devices": min_devices, "max_devices": max_devices,
                                      "checkpoint_every": checkpoint_every, "max_restarts": max_restarts,
                                      "workdir": workdir}, env or [])
        except ValidationError as exc:
            fail(exc, code=2)  # a usage error, found before anything was sent
        job = Api().post("/v1/jobs", json=body)
        if quiet:
            print(job["id"])
        else:
            console.print(f"submitted job [bold]{job['id']}[/] ({job['name']})")
            if job.get("admitted_as"):
                console.print(f"[yellow]admitted as {job['admitted_as']}[/]: {job['admission']}", highlight=False)

    @app.command("ls")
    def ls(all_users: bool = typer.Option(False, "--all", help="every user's jobs (admin)")) -> None:
        """List your jobs."""
        t = Table("id", "name", "tier", "ranks", "state", "nodes", "restarts", "submitted", "reason")
        for j in Api().get("/v1/jobs", params={"all": all_users}):
            state = j["state"] + (" (held)" if j["held"] and j["state"] != "held" else "")
            t.add_row(j["id"], j["name"], j["tier"], str(j["ranks"]), state, ",".join(j["nodes"]) or "-",
                      str(j["restarts"]), _when(j["submitted_at"]), escape(j.get("reason") or "-"))
        console.print(t)

    @app.command()
    def show(job_id: str, as_json: bool = typer.Option(False, "--json")) -> None:
        """Show a job: state, placement, checkpoints, events."""
        job = Api().get(f"/v1/jobs/{job_id}")
        if as_json:
            print(json.dumps(job, indent=1))
            return
        console.print(f"[bold]{job['id']}[/] {job['name']}  {job['tier']}  [bold]{job['state']}[/]"
                      + ("  (held)" if job["held"] else "")
                      + (f"  exit code {job['exit_code']}" if job["exit_code"] is not None else ""))
        console.print(f"command: {' '.join(job['command'])}\nworkdir: {job['workdir']}")
        if job.get("reason"):
            console.print(f"[yellow]waiting:[/] {escape(job['reason'])}", highlight=False)
        if job["error"]:
            console.print(f"[red]error:[/] {job['error']}")
        prog = job.get("progress")
        if prog and job["placement"]:
            steps = ""
            if "steps" in prog:
                rate = f" ({prog['steps_per_s']:.2f}/s)" if "steps_per_s" in prog else ""
                crate = f" ({prog['collectives_per_s']:.1f}/s)" if "collectives_per_s" in prog else ""
                steps = f"{prog['steps']} steps{rate}, {prog.get('collectives', 0)} collectives{crate}, "
            console.print(f"progress: {steps}{prog['cpu_s']:.1f} CPU-s, {prog['rss_bytes'] / 2**20:.0f} MiB "
                          f"resident, {prog['output_bytes']} bytes of output (at {_when(prog['time'])})")
        if job["placement"]:
            pinned = " (pinned by resize)" if job.get("pinned_devices") else ""
            console.print(f"ranks: {job['ranks']} on {job['devices']} device(s){pinned}, "
                          f"allowed {job['min_devices']}..{job['max_devices']}")
            t = Table("rank", "node", "device", "pid")
            for p in job["placement"]:
                t.add_row(str(p["rank"]), p["node"], str(p["device"]), str(p["pid"] or "-"))
            console.print(t)
        if job["checkpoints"]:
            _checkpoints_table(job["checkpoints"], job.get("resume_from"))
        _events_table(job["events"])

    @app.command()
    def logs(job_id: str, follow: bool = typer.Option(False, "-f", "--follow"),
             rank: int = typer.Option(0, "--rank", min=0)) -> None:
        """Print a rank's output exactly as the program wrote it (across all its restores)."""
        api = Api()
        offset = 0
        out = sys.stdout.buffer
        while True:
            r = api.request("GET", f"/v1/jobs/{job_id}/logs", params={"rank": rank, "offset": offset})
            size = int(r.headers["X-Tidal-Log-Size"])
            out.write(r.content)
            out.flush()
            # A reply holds at most a few MiB of the log: ask again from where it ended.
            offset = offset + len(r.content) if r.content else min(offset, size)
            if offset < size:
                continue
            if not follow:
                return
            if r.headers["X-Tidal-Job-State"] in TERMINAL and not r.content:
                return
            time.sleep(0.2)

    @app.command("wait")
    def wait_(job_id: str, timeout: float = typer.Option(86400.0, help="seconds")) -> None:
        """Wait until the job ends; exit with its exit code."""
        job = wait_stable(Api(), job_id, lambda j: j["state"] in TERMINAL, timeout, "waiting for")
        code = job["exit_code"]
        if job["state"] == "cancelled":
            console.print(f"job {job_id} was cancelled", style="yellow")
            raise typer.Exit(130)
        if code is None:
            console.print(f"job {job_id} {job['state']}: {job['error'] or ''}", style="red")
            raise typer.Exit(1)
        raise typer.Exit(code if code < 256 else 1)

    @app.command()
    def cancel(job_id: str) -> None:
        """Cancel a job (its ranks are killed)."""
        job = Api().post(f"/v1/jobs/{job_id}/cancel")
        console.print(f"job {job_id} {job['state']}")

    @app.command()
    def checkpoints(job_id: str,
                    output: str = typer.Option("table", "-o", "--output", help="table | json")) -> None:
        """List a job's checkpoints, oldest first: committed ones, and bad ones (they failed verification on
        restore; kept for inspection, never restored)."""
        if output not in ("table", "json"):
            raise ValidationError(f"--output must be table or json, not {output!r}", field="output",
                                  hint="-o table or -o json")
        rows = Api().get(f"/v1/jobs/{job_id}/checkpoints")
        if output == "json":
            print(json.dumps(rows, indent=1))
            return
        _checkpoints_table(rows, Api().get(f"/v1/jobs/{job_id}").get("resume_from"))

    @app.command()
    def events(job: str = typer.Option(None, "--job"),
               last: int = typer.Option(200, "-n", help="the last N events")) -> None:
        """The event log: every state change with its cause."""
        params: dict[str, Any] = {"job": job, "last": last} if job else {"last": last}
        _events_table(Api().get("/v1/events", params=params),
                      with_job=job is None)

    @app.command()
    def preempt(job_id: str, no_wait: bool = typer.Option(False, "--no-wait"),
                timeout: float = typer.Option(300.0)) -> None:
        """Checkpoint the job, release its devices and hold it until `tidal resume`."""
        api = Api()
        _request(api, job_id, "preempt", timeout)
        if no_wait:
            return
        job = wait_stable(api, job_id, lambda j: (not j["busy"] and j["state"] in STABLE - {"pending"})
                          or j["state"] == "held", timeout, "preempting")
        if job["state"] == "running":
            raise TidalError(f"job {job_id} could not be preempted: {_last_detail(job)}",
                             hint="it goes on running")
        console.print(f"job {job_id} {job['state']}" + (" (held)" if job["held"] else ""))

    @app.command()
    def resume(job_id: str,
               from_: str = typer.Option(None, "--from", help="a checkpoint id (`tidal checkpoints JOB`) to resume "
                                         "from instead of the newest; the job must be stopped"),
               no_wait: bool = typer.Option(False, "--no-wait"),
               timeout: float = typer.Option(300.0)) -> None:
        """Release a job's hold; it runs again where there is room."""
        api = Api()
        before = api.get(f"/v1/jobs/{job_id}")
        seq = before["events"][-1]["seq"] if before["events"] else 0
        _request(api, job_id, "resume", timeout, json={"from": from_})
        if no_wait:
            return
        job = wait_stable(api, job_id, lambda j: not j["busy"] and j["state"] in {"running", *TERMINAL},
                          timeout, "resuming")
        for e in _since(job, seq):
            if e["kind"] == "checkpoint_bad":
                console.print(f"[yellow]{escape(e['detail'])}[/]", highlight=False)
        if job["state"] == "failed":
            raise TidalError(f"job {job_id} failed: {job['error']}",
                             hint=f"its output: `tidal logs {job_id}`; its events: `tidal show {job_id}`")
        where = ",".join(sorted({p["node"] for p in job["placement"]}))
        console.print(f"job {job_id} {job['state']}" + (f" on {where}" if where else ""))

    @app.command()
    def migrate(job_id: str, to: str = typer.Option(None, "--to", help="node (default: other nodes with room)"),
                rank: int = typer.Option(None, "--rank", min=0, help="move only this rank (needs --to)"),
                no_wait: bool = typer.Option(False, "--no-wait"),
                timeout: float = typer.Option(300.0)) -> None:
        """Move a running job, or one of its ranks, to other nodes (checkpoint every rank at a consistent
        cut, stop, restore with the new placement)."""
        api = Api()
        before = api.get(f"/v1/jobs/{job_id}")
        seq = before["events"][-1]["seq"] if before["events"] else 0
        _request(api, job_id, "migrate", timeout, json={"to": to, "rank": rank})
        if no_wait:
            return
        job = wait_stable(api, job_id, lambda j: not j["busy"] and j["state"] in STABLE, timeout, "migrating")
        nodes = {p["node"] for p in job["placement"]}
        if job["state"] == "running" and job["attempt"] == before["attempt"]:
            evs = _since(job, seq)
            raise TidalError(f"job {job_id} was not migrated: {evs[-1]['detail'] if evs else 'unknown'}",
                             hint="it goes on running where it was")
        console.print(f"job {job_id} {job['state']}" + (f" on {','.join(sorted(nodes))}" if nodes else ""))


def _resize_cmd(app: typer.Typer) -> None:
    @app.command()
    def resize(job_id: str,
               devices: int = typer.Option(None, "--devices", "-d", help="run the job's W ranks on D devices"),
               auto: bool = typer.Option(False, "--auto", help="let the scheduler choose D again"),
               no_wait: bool = typer.Option(False, "--no-wait"),
               timeout: float = typer.Option(300.0)) -> None:
        """Run a job on another number of devices D (its world size W stays): a consistent cut, a
        checkpoint of every rank, a restore with ranks packed onto D devices. D stays pinned until --auto."""
        if (devices is None) == (not auto):
            raise ValidationError("give either --devices D or --auto", field="devices",
                                  hint="--devices D pins the job to D devices; --auto lets the scheduler choose")
        api = Api()
        before = api.get(f"/v1/jobs/{job_id}")
        seq = before["events"][-1]["seq"] if before["events"] else 0
        r = _request(api, job_id, "resize", timeout, json={"devices": None if auto else devices})
        if auto:
            console.print(f"job {job_id} is resized by the scheduler again (now on {r['devices']} device(s))")
            return
        if no_wait:
            return
        job = wait_stable(api, job_id, lambda j: not j["busy"] and j["state"] in STABLE, timeout, "resizing")
        if job["state"] == "running" and job["devices"] != devices:
            evs = _since(job, seq)
            raise TidalError(f"job {job_id} was not resized: {evs[-1]['detail'] if evs else 'unknown'}",
                             hint="it goes on running as it was")
        where = ", ".join(f"{p['node']}:{p['device']}" for p in job["placement"])
        console.print(f"job {job_id} {job['state']} on {job['devices']} device(s) (rank → device: {where})")


def _checkpoints_table(rows: list[dict[str, Any]], resume_from: str | None) -> None:
    t = Table("checkpoint", "created", "bytes", "stored", "state")
    for c in rows:
        note = " (resumes from it)" if c["id"] == resume_from else ""
        t.add_row(c["id"], _when(c["created_at"]), str(c["bytes"]), str(c["stored_bytes"]), c["state"] + note)
    console.print(t)


def _last_detail(job: dict[str, Any]) -> str:
    return str(job["events"][-1]["detail"]) if job["events"] else "unknown"


def _events_table(evs: list[dict[str, Any]], with_job: bool = False) -> None:
    cols = ["time", *(["job"] if with_job else []), "kind", "node", "cause", "detail"]
    t = Table(*cols)
    for e in evs:
        row = [_when(e["time"]), *([e["job"] or "-"] if with_job else []), e["kind"], e["node"] or "-",
               e["cause"] or "-", e["detail"]]
        t.add_row(*row)
    console.print(t)
