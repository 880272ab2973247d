"""Job commands: submit, ls, show, logs, wait, cancel, checkpoints, events, preempt, resume, migrate (ls, cancel and
preempt by filters too: :mod:`tidal.cli.selection`).

Every `tidal ls` or `tidal show` imports this module: what only some commands use (YAML, the checks of a
submission, rich's text) is imported in them (see tests/unit/cli/test_startup.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import typer

from tidal.cli import listings, selection, units
from tidal.cli.api import Api, Client
from tidal.cli.formats import Format, emit, output_option, print_rows, print_table
from tidal.cli.logs import CANCELLED, TERMINAL, exit_status, outcome
from tidal.cli.output import console, fail
from tidal.cli.terms import flag, phrased
from tidal.cli.units import parse_duration
from tidal.errors import Conflict, TidalError, ValidationError

STABLE = {"running", "preempted", "held", "pending", "succeeded", "failed", "cancelled"}


# How the CLI reads a field of a job, in a job file or from an option, where the API takes it otherwise:
# a command as one string is run by sh; a duration may have a unit.
_FORMS: dict[str, Callable[[Any], Any]] = {
    "command": lambda v: ["sh", "-c", v] if isinstance(v, str) else v,
    "checkpoint_every": lambda v: parse_duration(v) if isinstance(v, str) else v,
    "runtime": lambda v: parse_duration(v, "runtime") if isinstance(v, str) else v,
}
@cache
def submitted() -> frozenset[str]:
    """The fields a submission may give (JobSpec's): the request's body is made of these."""
    from tidal.core import JobSpec

    return frozenset(f.name for f in JobSpec.submission_fields())


def _as_submitted(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: _FORMS[k](v) if k in _FORMS else v for k, v in fields.items()}


def load_job_file(path: Path) -> dict[str, Any]:
    import yaml

    from tidal.cli import jobcheck

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
    from tidal.cli import jobcheck, jobenv

    assert set(options) <= submitted(), set(options) - submitted()
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


def submission_terms(file: Path | None, options: dict[str, Any]) -> dict[str, str]:
    """What the user calls each field of a submission: the flag, or the job file's key where the file gave it
    and no flag did (the key is the user's word then: it stays, and the file is named)."""
    from_file = set(load_job_file(file)) if file else set()
    names = {f: flag(f) for f in submitted() if f != "command"}
    for f in from_file & submitted():
        if options.get(f) in (None, []):
            names[f] = f"{f} (in {file})"
    return names


def wait_stable(api: Client, job_id: str, done: Any, timeout: float, what: str) -> dict[str, Any]:
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


def _request(api: Client, job_id: str, verb: str, timeout: float, **kw: Any) -> dict[str, Any]:
    """POST the request, retrying while the job is busy (another checkpoint or a start in flight)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return api.post(f"/v1/jobs/{job_id}/{verb}", **kw)  # type: ignore[no-any-return]
        except Conflict as exc:
            if not exc.fields.get("busy") or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def job_argument() -> Any:
    return typer.Argument(..., metavar="JOB", help="the job's id (`tidal ls`)")


def jobs_argument() -> Any:
    return typer.Argument(None, metavar="JOB", help="the jobs' ids (`tidal ls`); or select them with the filters")


def _selection(job_ids: list[str] | None, state: list[str] | None, user: list[str] | None, name: str | None,
               tier: list[str] | None, since: str | None, all_users: bool, verb: str) -> selection.Selection:
    """The filters of `cancel`/`preempt`: given with no job ids, or the ids without filters (a usage error else)."""
    sel = selection.from_options(state, user, name, tier, since, all_users)
    if job_ids and not sel.empty:
        fail(ValidationError(f"give the jobs to {verb} by id or by filters, not both",
                             hint=f"`tidal {verb} JOB...`, or `tidal {verb} --state S --user U --name N ...`"), code=2)
    if not job_ids and sel.empty:
        fail(ValidationError(f"give the jobs to {verb}: their ids, or filters (--state, --user, --name, --tier, "
                             "--since, --all)", hint=f"see `tidal {verb} --help`"), code=2)
    return sel


def no_wait_option() -> Any:
    return typer.Option(False, "--no-wait", help="return once the request is accepted")


def timeout_option() -> Any:
    return typer.Option(300.0, "--timeout", help="seconds to wait for it at most")


def _since(job: dict[str, Any], seq: int) -> list[dict[str, Any]]:
    return [e for e in job["events"] if e["seq"] > seq]


def register(app: typer.Typer) -> None:
    _resize_cmd(app)
    @app.command(context_settings={"allow_interspersed_args": False})
    def submit(
        command: list[str] = typer.Argument(None, help="the command, after --"),
        name: str = typer.Option(None, "--name", help="a name to know it by"),
        tier: str = typer.Option(None, "--tier", help="premium | standard | basic (default basic)"),
        project: str = typer.Option(None, "--project",
                                    help="the project whose quota admits premium and standard jobs (default: default)"),
        ranks: int = typer.Option(None, "--ranks", help="world size W; given (even 1), each rank sees torchrun's "
                                  "environment (RANK, WORLD_SIZE, MASTER_ADDR, ...); left out, one process "
                                  "that sees what plain `python` would"),
        region: str = typer.Option(None, "--region", help="run only in this region (`tidal nodes`)"),
        cluster: str = typer.Option(None, "--cluster", help="run only in this cluster"),
        min_devices: int = typer.Option(None, "--min-devices",
                                        help="the fewest devices D it may run on (elastic; default W)"),
        max_devices: int = typer.Option(None, "--max-devices", help="the most devices D (default W)"),
        checkpoint_every: str = typer.Option(None, "--checkpoint-every", help="e.g. 30s, 5m"),
        runtime: str = typer.Option(None, "--runtime",
                                    help="its expected run time at full size, e.g. 2h: a premium or standard job "
                                         "whose SLA the load cannot meet is then told so (demoted, refused or "
                                         "deferred, by the site's TIDAL_ADMIT_SLA), and one whose full size is not "
                                         "free starts on fewer devices when that ends sooner than waiting"),
        max_restarts: int = typer.Option(None, "--max-restarts",
                                         help="restarts after failures or lost nodes before it fails"),
        workdir: Path = typer.Option(None, "--workdir", help="default: the current directory"),
        file: Path = typer.Option(None, "-f", "--file", help="a job.yaml"),
        env: list[str] = typer.Option(None, "--env", "-e", metavar="NAME[=VALUE]",
                                      help="set a variable in the job's environment (NAME alone: your value); "
                                           "repeatable"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the job id"),
    ) -> None:
        """Submit a job: `tidal submit [options] -- CMD ...`. Its environment: PATH, HOME, locale, Python
        and threading variables of yours (see docs/cluster.md), job.yaml's env and each --env."""
        options = {"command": command, "name": name, "tier": tier, "project": project, "ranks": ranks,
                   "min_devices": min_devices, "max_devices": max_devices, "checkpoint_every": checkpoint_every,
                   "runtime": runtime,
                   "max_restarts": max_restarts, "workdir": workdir, "region": region, "cluster": cluster}
        names = {f: flag(f) for f in submitted() if f != "command"}
        try:
            names = submission_terms(file, options)
            body = _submission(file, options, env or [])  # its errors already name the flag or the key
        except ValidationError as exc:  # a usage error, found before anything was sent
            fail(exc if exc.hint else ValidationError(exc.message, hint="see `tidal submit --help`", **exc.fields),
                 code=2)
        # The control plane's refusals name its fields: call them what the user typed.
        with phrased(names, hint="see `tidal submit --help`"):
            job = Api().post("/v1/jobs", json=body)
        if quiet:
            print(job["id"])
        else:
            console.print(f"submitted job [bold]{job['id']}[/] ({job['name']})")
            if job.get("admitted_as"):
                console.print(f"[yellow]admitted as {job['admitted_as']}[/]: {job['admission']}", highlight=False)
            if job.get("deferred"):
                console.print(f"[yellow]deferred[/]: {job['deferred']}", highlight=False)

    @app.command("ls")
    def ls(all_users: bool = selection.all_option(),
           state: list[str] = selection.state_option(), user: list[str] = selection.user_option(),
           name: str = selection.name_option(), tier: list[str] = selection.tier_option(),
           since: str = selection.since_option(),
           limit: int = typer.Option(selection.PAGE, "--limit", "-n", min=1, max=selection.MAX_PAGE, metavar="N",
                                     help=f"show at most N jobs, the newest (at most {selection.MAX_PAGE:,}); with "
                                          "--all-pages, the jobs fetched per request"),
           all_pages: bool = typer.Option(False, "--all-pages",
                                          help="every job the filters select, fetched page after page"),
           output: Format = output_option()) -> None:
        """List your jobs, newest first: at most --limit of them (1000), with a notice on stderr when more exist."""
        sel = selection.from_options(state, user, name, tier, since, all_users)
        listed = selection.fetch(Api(), sel.params(), limit, all_pages)
        print_rows(listed.jobs, listings.JOBS, output)
        selection.notices(listed, all_users)

    @app.command()
    def show(job_id: str = job_argument(), output: Format = output_option(),
             as_json: bool = typer.Option(False, "--json", help="as -o json")) -> None:
        """Show a job: state, placement, progress, checkpoints, events."""
        job = Api().get(f"/v1/jobs/{job_id}")
        emit(job, Format.json if as_json else output, lambda wide: _show(job, wide))

    @app.command("wait")
    def wait_(job_id: str = job_argument(),
              timeout: float = typer.Option(86400.0, help="seconds to wait at most")) -> None:
        """Wait until the job ends; exit with its exit status (0: succeeded; failed: the failing rank's exit
        code, 1 without one; 130: cancelled)."""
        job = wait_stable(Api(), job_id, lambda j: j["state"] in TERMINAL, timeout, "waiting for")
        code = exit_status(job)
        if code:
            from rich.text import Text

            console.print(Text(outcome(job), style="yellow" if code == CANCELLED else "red"))
        raise typer.Exit(code)

    @app.command()
    def cancel(job_ids: list[str] = jobs_argument(),
               state: list[str] = selection.state_option(), user: list[str] = selection.user_option(),
               name: str = selection.name_option(), tier: list[str] = selection.tier_option(),
               since: str = selection.since_option(), all_users: bool = selection.all_option(),
               yes: bool = selection.yes_option()) -> None:
        """Cancel jobs (their ranks are killed): those given by id, or those the filters select, as scancel does
        (`tidal cancel --user alice --state pending --name 'sweep-*'`; without --state, those not yet ended).
        More than 5 jobs, or any a filter selects, are shown and confirmed first, unless --yes. Each job's outcome
        is printed (cancelled, already finished, not found); the exit status is 1 where one was not found."""
        sel = _selection(job_ids, state, user, name, tier, since, all_users, "cancel")
        if len(job_ids or []) == 1:
            job = Api().post(f"/v1/jobs/{job_ids[0]}/cancel")
            console.print(f"job {job_ids[0]} {job['state']}")
            return
        code = selection.act(Api(), "cancel", job_ids or [], sel, yes)
        if code:
            raise typer.Exit(code)

    @app.command()
    def checkpoints(job_id: str = job_argument(), output: Format = output_option()) -> None:
        """List a job's checkpoints, oldest first: committed ones, and bad ones (they failed verification on
        restore; kept for inspection, never restored)."""
        api = Api()
        rows = api.get(f"/v1/jobs/{job_id}/checkpoints")
        emit(rows, output, lambda wide: _checkpoints_table(rows, api.get(f"/v1/jobs/{job_id}").get("resume_from"),
                                                           wide))

    @app.command()
    def events(job: str = typer.Option(None, "--job", help="only this job's events"),
               last: int = typer.Option(200, "-n", help="the last N events"),
               follow: bool = typer.Option(False, "-f", "--follow",
                                           help="then print each new event as it is recorded, until interrupted; "
                                                "with --job, until the job ends, then exit with its exit status "
                                                "as `tidal wait` does (-o json: one object per line)"),
               output: Format = output_option()) -> None:
        """The event log, oldest first: every state change with its cause."""
        if follow:
            from tidal.cli import eventfollow

            code = eventfollow.follow(Api(), job, last, output)
            if code:
                raise typer.Exit(code)
            return
        params: dict[str, Any] = {"job": job, "last": last} if job else {"last": last}
        rows = Api().get("/v1/events", params=params)
        emit(rows, output, lambda wide: _events_table(rows, wide, with_job=job is None))

    @app.command()
    def preempt(job_ids: list[str] = jobs_argument(), no_wait: bool = no_wait_option(),
                timeout: float = timeout_option(),
                state: list[str] = selection.state_option(), user: list[str] = selection.user_option(),
                name: str = selection.name_option(), tier: list[str] = selection.tier_option(),
                since: str = selection.since_option(), all_users: bool = selection.all_option(),
                yes: bool = selection.yes_option()) -> None:
        """Checkpoint a job, release its devices and hold it until `tidal resume`. Several jobs (by id, or those
        the filters select, as `tidal cancel` takes them): each is asked to, without waiting for it (as
        --no-wait), and more than 5, or any a filter selects, are confirmed first, unless --yes; each job's outcome
        is printed (held, preempting: checkpointed then held, busy: try again, already finished, not found), and
        the exit status is 1 where one was busy or not found."""
        sel = _selection(job_ids, state, user, name, tier, since, all_users, "preempt")
        if len(job_ids or []) != 1:
            code = selection.act(Api(), "preempt", job_ids or [], sel, yes)
            if code:
                raise typer.Exit(code)
            return
        job_id = job_ids[0]
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
    def resume(job_id: str = job_argument(),
               from_: str = typer.Option(None, "--from", help="a checkpoint id (`tidal checkpoints JOB`) to resume "
                                         "from instead of the newest; the job must be stopped"),
               no_wait: bool = no_wait_option(),
               timeout: float = timeout_option()) -> None:
        """Release a job's hold; it runs again where there is room."""
        api = Api()
        before = api.get(f"/v1/jobs/{job_id}")
        seq = before["events"][-1]["seq"] if before["events"] else 0
        _request(api, job_id, "resume", timeout, json={"from": from_})
        if no_wait:
            return
        job = wait_stable(api, job_id, lambda j: not j["busy"] and j["state"] in {"running", *TERMINAL},
                          timeout, "resuming")
        from rich.markup import escape

        for e in _since(job, seq):
            if e["kind"] == "checkpoint_bad":
                console.print(f"[yellow]{escape(e['detail'])}[/]", highlight=False)
        if job["state"] == "failed":
            raise TidalError(f"job {job_id} failed: {job['error']}",
                             hint=f"its output: `tidal logs {job_id}`; its events: `tidal show {job_id}`")
        where = ",".join(sorted({p["node"] for p in job["placement"]}))
        console.print(f"job {job_id} {job['state']}" + (f" on {where}" if where else ""))

    @app.command()
    def migrate(job_id: str = job_argument(),
                to: str = typer.Option(None, "--to", help="node (default: other nodes with room)"),
                rank: int = typer.Option(None, "--rank", min=0, help="move only this rank (needs --to)"),
                to_region: str = typer.Option(None, "--to-region",
                                              help="onto nodes of this region (its checkpoint is copied to the "
                                                   "region's store first where that is another)"),
                to_cluster: str = typer.Option(None, "--to-cluster", help="onto nodes of this cluster"),
                no_wait: bool = no_wait_option(),
                timeout: float = timeout_option()) -> None:
        """Move a running job, or one of its ranks, to other nodes (checkpoint every rank at a consistent
        cut, stop, restore with the new placement)."""
        api = Api()
        before = api.get(f"/v1/jobs/{job_id}")
        seq = before["events"][-1]["seq"] if before["events"] else 0
        body = {"to": to, "rank": rank, "region": to_region, "cluster": to_cluster}
        _request(api, job_id, "migrate", timeout, json={k: v for k, v in body.items() if v is not None})
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
    def resize(job_id: str = job_argument(),
               devices: int = typer.Option(None, "--devices", "-d", help="run the job's W ranks on D devices"),
               auto: bool = typer.Option(False, "--auto", help="let the scheduler choose D again"),
               no_wait: bool = no_wait_option(),
               timeout: float = timeout_option()) -> None:
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


def _show(job: dict[str, Any], wide: bool) -> None:
    """A job for people: a few lines, then its placement, checkpoints and events as tables."""
    from rich.text import Text

    head = Text.assemble((job["id"], "bold"), f" {job['name']}  {job['tier']}  ",
                         (job["state"], listings.STATE_STYLE.get(job["state"], "bold")))
    if job["held"]:
        head.append("  (held)")
    if job["exit_code"] is not None:
        head.append(f"  exit code {job['exit_code']}")
    console.print(head)
    console.print(Text(f"command: {' '.join(job['command'])}\nworkdir: {job['workdir']}"))
    if job.get("reason"):
        console.print(Text.assemble(("waiting:", "yellow"), f" {job['reason']}"))
    if job["error"]:
        console.print(Text.assemble(("error:", "red"), f" {job['error']}"))
    prog = job.get("progress")
    if prog and "copy_to_go_bytes" in prog:
        console.print(Text(f"copying its checkpoint from another region's store: "
                           f"{units.size(prog['copy_to_go_bytes'])} of {units.size(prog['copy_total_bytes'])} to go "
                           f"(at {units.clock(prog['time'])})"))
    if prog and job["placement"] and "cpu_s" in prog:
        steps = ""
        if "steps" in prog:
            rate = f" ({units.rate(prog['steps_per_s'])})" if "steps_per_s" in prog else ""
            crate = f" ({units.rate(prog['collectives_per_s'])})" if "collectives_per_s" in prog else ""
            steps = f"{prog['steps']} steps{rate}, {prog.get('collectives', 0)} collectives{crate}, "
        gpu = (f"{units.size(prog['gpu_rank_bytes'])} of GPU memory per rank at most, "
               if "gpu_rank_bytes" in prog else "")
        console.print(Text(f"progress: {steps}{units.duration(prog['cpu_s'])} of CPU, {units.size(prog['rss_bytes'])} "
                           f"resident, {gpu}{units.size(prog['output_bytes'])} of output "
                           f"(at {units.clock(prog['time'])})"))
        if prog.get("stalled"):
            console.print(Text.assemble(("stalled:", "red"), f" no step and no collective since "
                                        f"{units.clock(prog['still_since'])}; its ranks may be waiting on each other"))
    if job["placement"]:
        pinned = " (pinned by resize)" if job.get("pinned_devices") else ""
        console.print(f"ranks: {job['ranks']} on {job['devices']} device(s){pinned}, "
                      f"allowed {job['min_devices']}..{job['max_devices']}", highlight=False)
        console.print()
        print_table(job["placement"], listings.PLACEMENT.columns, wide)
    if job["checkpoints"]:
        console.print()
        _checkpoints_table(job["checkpoints"], job.get("resume_from"), wide)
    console.print()
    _events_table(job["events"], wide)


def _checkpoints_table(rows: list[dict[str, Any]], resume_from: str | None, wide: bool) -> None:
    print_table([{**c, "resumes": c["id"] == resume_from} for c in rows], listings.CHECKPOINTS.columns, wide)


def _last_detail(job: dict[str, Any]) -> str:
    return str(job["events"][-1]["detail"]) if job["events"] else "unknown"


def _events_table(evs: list[dict[str, Any]], wide: bool, with_job: bool = False) -> None:
    cols = [c for c in listings.EVENTS.columns if with_job or c.header != "JOB"]
    print_table(evs, cols, wide)
