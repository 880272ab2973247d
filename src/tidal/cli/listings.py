"""What each listing and show command prints: the fields of its JSON/YAML items (the API's, documented here and
in docs/cli.md, which is generated from these) and the columns of its tables, in human units."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tidal.cli import units
from tidal.cli.formats import Column, Listing, Row

STATE_STYLE = {"running": "green", "succeeded": "green", "failed": "bold red", "cancelled": "dim",
               "pending": "yellow", "preempted": "cyan", "held": "cyan", "checkpointing": "blue",
               "migrating": "blue", "restoring": "blue"}


def _state(r: Row) -> str | None:
    return STATE_STYLE.get(str(r.get("state")))


def _text(key: str) -> Callable[[Row], str]:
    return lambda r: "-" if r.get(key) is None else str(r[key])


def _job_state(j: Row) -> str:
    return str(j["state"]) + (" (held)" if j.get("held") and j["state"] != "held" else "")


JOB_FIELDS = {
    "id": "the job's id",
    "name": "its name (--name)",
    "owner": "the user who submitted it",
    "tier": "premium, standard or basic (as admitted: over its project's quota, a job runs as basic)",
    "ranks": "its world size W (--ranks)",
    "state": "pending, running, checkpointing, preempted, migrating, restoring, held, succeeded, failed or cancelled",
    "held": "true while held by `tidal preempt` (until `tidal resume`)",
    "submitted_at": "when it was submitted (Unix time, seconds)",
    "exit_code": "its exit code once it ended on its own (null otherwise)",
    "restarts": "how many times it was restarted after a failure or a lost node",
    "nodes": "the nodes its ranks run on, sorted",
    "reason": "why it waits, as the scheduler's policy sees it, while it waits (null otherwise)",
    "reason_code": "the kind of that reason, for scripts: e.g. devices, quota, behind, held (null when none)",
}

JOBS = Listing("ls", JOB_FIELDS, (
    Column("ID", _text("id")),
    Column("NAME", _text("name")),
    Column("OWNER", _text("owner"), wide=True),
    Column("TIER", _text("tier")),
    Column("RANKS", _text("ranks")),
    Column("STATE", _job_state, style=_state),
    Column("NODES", lambda j: ",".join(j["nodes"]) or "-"),
    Column("RESTARTS", _text("restarts")),
    Column("EXIT", _text("exit_code"), wide=True),
    Column("SUBMITTED", lambda j: units.ago(j["submitted_at"])),
    Column("SUBMITTED AT", lambda j: units.clock(j["submitted_at"]), wide=True),
    Column("REASON", _text("reason")),
), note="Your jobs, newest first (--all: every user's, for an admin), a page of at most --limit (1000) with a notice "
        "on stderr when more exist (--all-pages: all of them); REASON: why a waiting job waits.")

PLACEMENT = Listing("show: placement", {
    "rank": "the rank", "node": "the node it runs on", "device": "its device there",
    "pid": "its process id on that node (null while starting)"},
    (Column("RANK", _text("rank")), Column("NODE", _text("node")), Column("DEVICE", _text("device")),
     Column("PID", _text("pid"))))

CHECKPOINTS = Listing("checkpoints", {
    "id": "the checkpoint's id (for `tidal resume JOB --from ID`)",
    "created_at": "when it was taken (Unix time, seconds)",
    "bytes": "the size of the ranks' images (bytes)",
    "stored_bytes": "what it added to the store (bytes: chunks not already there)",
    "parts": "its parts, one a node (their ids)",
    "state": "committed; committing (a resize or a move within its node restored the job from its images while "
             "they are committed: it counts once committed); or bad (it failed verification on restore: kept for "
             "inspection, never restored)",
    "regions": "the regions whose checkpoint store holds it (null: every region shares one store)",
}, (
    Column("CHECKPOINT", _text("id")),
    Column("CREATED", lambda c: units.ago(c["created_at"])),
    Column("CREATED AT", lambda c: units.clock(c["created_at"]), wide=True),
    Column("SIZE", lambda c: units.size(c["bytes"])),
    Column("STORED", lambda c: units.size(c["stored_bytes"])),
    Column("PARTS", lambda c: str(len(c["parts"])), wide=True),
    Column("REGIONS", lambda c: ",".join(c.get("regions") or []) or "-", wide=True),
    Column("STATE", lambda c: c["state"] + (" (resumes from it)" if c.get("resumes") else ""),
           style=lambda c: "bold red" if c["state"] == "bad" else None),
), note="A job's checkpoints, oldest first.")

EVENTS = Listing("events", {
    "seq": "its place in the log (increasing)",
    "id": "the event's id",
    "time": "when it happened (Unix time, seconds)",
    "kind": "what happened: the state entered (running, preempted, …) or a note (checkpoint_bad, …)",
    "job": "the job it is about (null: the cluster's)",
    "node": "the node it happened on (null: none)",
    "cause": "what caused it: a user's request (api:NAME), the scheduler, a node, …",
    "detail": "what happened, in words",
}, (
    Column("SEQ", _text("seq"), wide=True),
    Column("TIME", lambda e: units.clock(e["time"])),
    Column("JOB", _text("job")),
    Column("KIND", _text("kind")),
    Column("NODE", _text("node")),
    Column("CAUSE", _text("cause")),
    Column("DETAIL", _text("detail")),
), note="Oldest first.")

JOB_DETAIL = Listing("show", {
    **JOB_FIELDS,
    "command": "its command (argv)",
    "workdir": "its working directory",
    "checkpoint_every": "seconds between periodic checkpoints (null: none)",
    "max_restarts": "how many restarts it may have",
    "started_at": "when it first started (Unix time; null: not yet)",
    "finished_at": "when it ended (Unix time; null: not yet)",
    "error": "why it failed or was lost (null: it did not)",
    "attempt": "how many times its ranks were started (launches and restores)",
    "terminal": "true once it succeeded, failed or was cancelled",
    "busy": "true while an operation (a checkpoint, a start) is in flight",
    "progress": "the latest heartbeat's: time, cpu_s, rss_bytes, output_bytes; steps, steps_per_s, collectives, "
                "collectives_per_s for a distributed job; gpu_rank_bytes on GPU nodes, the most GPU memory one "
                "rank holds (null: none yet)",
    "exited": "the ranks that ended, by rank: code, signal, at",
    "devices": "how many devices it runs on (D)",
    "min_devices": "the fewest devices it may run on (--min-devices)",
    "max_devices": "the most (--max-devices)",
    "pinned_devices": "D pinned by `tidal resize --devices` (null: the scheduler chooses)",
    "resume_from": "the checkpoint it resumes from next (`tidal resume --from`; null: the newest)",
    "placement": "where each rank runs: the items of `show: placement`",
    "checkpoints": "its checkpoints: the items of `checkpoints`",
    "events": "its latest events: the items of `events`",
}, note="One job, as one object.")

NODES = Listing("nodes", {
    "name": "the node's name",
    "region": "its region",
    "cluster": "its cluster",
    "devices": "how many devices it offers",
    "free": "how many of them are free (0 while it is down)",
    "up": "true while its agent holds a lease",
    "cpus": "the CPUs of each device (lists of CPU numbers)",
    "address": "the address other nodes reach it at (null: not given)",
    "lease_left_s": "seconds left on its agent's lease",
    "gpus": "its devices' GPUs, where its devices are NVIDIA GPUs (`tidal agent --devices auto`): the items of "
            "`nodes: gpus` (null: CPU devices)",
    "drained": "null while it takes new jobs; drained (nothing new is placed or restored there, its jobs run on): "
               "lease (its lease was lost too often: undrained once healthy long enough) or admin (`tidal node "
               "drain`: until `tidal node undrain`)",
    "drain_reason": "why it is drained and until when (null: not drained)",
    "drained_at": "when it was drained (Unix time, seconds; null: not drained)",
    "undrain_at": "drained for its lost leases: when it is undrained if it stays up (null: not drained so, or down)",
}, (
    Column("NODE", _text("name")),
    Column("ADDRESS", _text("address")),
    Column("REGION/CLUSTER", lambda n: f"{n['region']}/{n['cluster']}"),
    Column("DEVICES", _text("devices")),
    Column("FREE", _text("free")),
    Column("CPUS", lambda n: str(sum(len(c) for c in n.get("cpus") or [])), wide=True),
    Column("UP", lambda n: "yes" if n["up"] else "no", style=lambda n: None if n["up"] else "bold red"),
    Column("LEASE LEFT", lambda n: units.duration(n["lease_left_s"])),
    Column("DRAINED", lambda n: n.get("drain_reason") or "-", style=lambda n: "yellow" if n.get("drained") else None),
))

NODE_GPUS = Listing("nodes: gpus", {
    "device": "the device's index on its node",
    "index": "its GPU's index as NVML numbers the node's GPUs",
    "uuid": "its GPU's UUID (GPU-…): the CUDA_VISIBLE_DEVICES of the ranks placed on the device",
    "model": "the GPU's model, as NVML names it",
    "memory_bytes": "the GPU's memory (bytes)",
    "jobs": "the jobs whose ranks run on the device now (ids; several when jobs share it)",
}, (
    Column("NODE", _text("node")),
    Column("DEVICE", _text("device")),
    Column("GPU", _text("index"), wide=True),
    Column("MODEL", _text("model")),
    Column("MEMORY", lambda g: units.size(g["memory_bytes"])),
    Column("JOBS", lambda g: ",".join(g.get("jobs") or []) or "-"),
    Column("UUID", _text("uuid"), wide=True),
), note="A GPU node's devices: one per GPU. `tidal nodes` shows them in a second table, under the nodes.")


NODE_LINKS = Listing("nodes: links", {
    "from": "the region a checkpoint was copied from",
    "to": "the region it was copied to",
    "gbps": "the link's measured rate, GB/s (10^9 bytes a second): the median of the last timed copies' rates",
    "copies": "copies from one region's store to the other's timed in all (each of 64 MiB or more)",
    "samples": "how many of the last copies the rate is the median of (at most 5)",
    "measured_at": "when the last one ended (Unix time)",
}, (
    Column("FROM", _text("from")),
    Column("TO", _text("to")),
    Column("GB/S", lambda r: f"{float(r['gbps']):.3g}"),
    Column("COPIES", _text("copies")),
    Column("MEASURED", lambda r: units.ago(r["measured_at"])),
), note="The links between regions measured from the checkpoints copied over them: `tidal nodes -o wide` shows "
        "them in a table under the nodes (`-o json|yaml` prints the nodes alone; GET /v1/links gives these items). "
        "The scheduler counts on a link not listed at TIDAL_REGION_GBPS, or 0.5 GB/s.")


def gpu_rows(nodes: Sequence[Row]) -> list[Row]:
    """The GPU devices of ``nodes`` (API items of `nodes`), one row each, with its node's name: none when every
    node's devices are CPU devices."""
    return [{"node": n["name"], **g} for n in nodes for g in (n.get("gpus") or [])]


TOKENS = Listing("token ls", {
    "id": "a join token's id (jt-…), or the node whose credential it is",
    "kind": "join (a join token), node (a node's own credential) or cluster (the local cluster's agents')",
    "node": "the node it is for (null: every node)",
    "created_at": "when it was made (Unix time)",
    "created_by": "the admin who made it (null: a credential)",
    "expires_at": "when a join token expires (Unix time; null: never)",
    "used_at": "when a node joined with it (Unix time; null: not yet)",
    "revoked_at": "when it was revoked (Unix time; null: it was not)",
    "state": "active, used, expired or revoked",
}, (
    Column("ID", _text("id")),
    Column("KIND", _text("kind")),
    Column("NODE", lambda r: r["node"] or "(every node)"),
    Column("STATE", _text("state"), style=lambda r: "green" if r["state"] == "active" else "dim"),
    Column("CREATED", lambda r: units.ago(r["created_at"])),
    Column("CREATED BY", _text("created_by"), wide=True),
    Column("EXPIRES", lambda r: units.ago(r["expires_at"])),
    Column("USED", lambda r: units.ago(r["used_at"])),
    Column("REVOKED", lambda r: units.ago(r["revoked_at"]), wide=True),
), note="Join tokens and the agents' credentials (admin).")

PROCESSES = Listing("status", {
    "url": "the local cluster's control plane URL",
    "processes": "its processes: name (control plane, or a node's agent), pid, alive",
    "nodes": "its nodes, as `nodes` lists them (none while the control plane is down)",
}, (
    Column("PROCESS", _text("name")),
    Column("PID", _text("pid")),
    Column("ALIVE", lambda p: "yes" if p["alive"] else "no", style=lambda p: None if p["alive"] else "bold red"),
), note="The local cluster (`tidal up`), as one object.")

CHECKS = Listing("doctor", {
    "ok": "true when every required check passes",
    "checks": "each check: name, status (ok, warn or missing), detail, fix (what to do), required",
}, (
    Column("REQUIREMENT", lambda c: c["name"] + ("" if c["required"] else " (optional)")),
    Column("STATUS", lambda c: str({"ok": "OK", "warn": "warn", "missing": "MISSING"}.get(c["status"], c["status"])),
           style=lambda c: {"ok": "green", "warn": "yellow", "missing": "bold red"}.get(c["status"])),
    Column("DETAIL", _text("detail")),
    Column("HOW TO FIX", _text("fix")),
), note="This machine's checks, as one object.")

STORE_USAGE = Listing("store usage", {
    "users": "per user: user, jobs, checkpoints, bytes, stored_bytes, quota (see below)",
    "jobs": "per job: job, name, owner, state, checkpoints, bytes, stored_bytes (see below)",
}, note="What the checkpoints kept take, as one object: yours (--all: every user's, for an admin).")

STORE_USERS = Listing("store usage: users", {
    "user": "the user",
    "jobs": "their jobs that keep checkpoints",
    "checkpoints": "the checkpoints kept",
    "bytes": "their size: the ranks' images (bytes); what the store quota counts",
    "stored_bytes": "what they added to the store when taken (bytes: chunks not already there)",
    "quota": "the user's store quota (bytes; null: none)",
}, (
    Column("USER", _text("user")),
    Column("JOBS", _text("jobs")),
    Column("CHECKPOINTS", _text("checkpoints")),
    Column("SIZE", lambda u: units.size(u["bytes"])),
    Column("STORED", lambda u: units.size(u["stored_bytes"])),
    Column("QUOTA", lambda u: "-" if u["quota"] is None else units.size(u["quota"]),
           style=lambda u: "bold red" if u["quota"] is not None and u["bytes"] > u["quota"] else None),
))

STORE_JOBS = Listing("store usage: jobs", {
    "job": "the job's id",
    "name": "its name",
    "owner": "its user",
    "state": "its state",
    "checkpoints": "its checkpoints kept",
    "bytes": "their size (bytes)",
    "stored_bytes": "what they added to the store (bytes)",
}, (
    Column("JOB", _text("job")),
    Column("NAME", _text("name")),
    Column("OWNER", _text("owner")),
    Column("STATE", _text("state"), style=_state),
    Column("CHECKPOINTS", _text("checkpoints")),
    Column("SIZE", lambda j: units.size(j["bytes"])),
    Column("STORED", lambda j: units.size(j["stored_bytes"])),
))

def limit_value(name: str, value: float | None) -> str:
    """A limit for people: ``unlimited``, ``50/s`` for a rate, else the number."""
    if value is None:
        return "unlimited"
    return f"{value:g}/s" if name == "rate" else f"{value:g}"


LIMIT_FIELDS = ("limits: each limit (rate: requests/s; burst: requests at once above it; max_queued: jobs waiting; "
                "max_devices: devices held) as {value (null: no limit), source: user or project (an admin set it) "
                "or default}")
USE_FIELDS = "what its jobs use: queued (jobs pending, held or preempted), devices (held now)"


def _projects(r: Row) -> str:
    return ", ".join(r["projects"]) if r.get("projects") else "-"


USERS = Listing("user ls", {
    "name": "the user's name",
    "role": "user, admin, metrics (a scraper's) or agent (a node's credential)",
    "unix_user": "the Unix account its jobs run as (null: the agent's own)",
    "created_at": "when it was made (Unix time)",
    "projects": "the projects it may submit under (default first); [] for agents and scrapers",
    "tokens": "how many of its tokens work (not revoked, not expired)",
    "usage": USE_FIELDS,
}, (
    Column("NAME", _text("name")),
    Column("ROLE", _text("role")),
    Column("UNIX USER", _text("unix_user")),
    Column("PROJECTS", _projects),
    Column("TOKENS", _text("tokens")),
    Column("QUEUED", lambda u: str(u["usage"]["queued"])),
    Column("DEVICES", lambda u: str(u["usage"]["devices"])),
    Column("CREATED", lambda u: units.ago(u["created_at"]), wide=True),
), note="Every account, by name (admin).")

USER_DETAIL = Listing("user show", {
    **{k: v for k, v in USERS.fields.items() if k != "usage"},
    "limits": LIMIT_FIELDS,
    "usage": USE_FIELDS + "; requests_refused (requests refused over its rate by the API process that answered, "
                          "since it started)",
}, note="One user, as one object.")
WHOAMI = Listing("whoami", USER_DETAIL.fields, note="Your own account, as `user show` shows one.")

PROJECTS = Listing("project ls", {
    "name": "the project's name",
    "created_at": "when it was made (Unix time)",
    "created_by": "the admin who made it (null: made from the jobs of an older version)",
    "members": "the users who may submit under it, besides admins (null for default: every user)",
    "limits": LIMIT_FIELDS.replace("rate: requests/s; burst: requests at once above it; ", "") + ", over all its jobs",
    "usage": USE_FIELDS,
}, (
    Column("PROJECT", _text("name")),
    Column("MEMBERS", lambda p: "(every user)" if p["members"] is None else ", ".join(p["members"]) or "-"),
    Column("QUEUED", lambda p: str(p["usage"]["queued"])),
    Column("MAX QUEUED", lambda p: limit_value("max_queued", p["limits"]["max_queued"]["value"])),
    Column("DEVICES", lambda p: str(p["usage"]["devices"])),
    Column("MAX DEVICES", lambda p: limit_value("max_devices", p["limits"]["max_devices"]["value"])),
    Column("CREATED", lambda p: units.ago(p["created_at"]), wide=True),
), note="Every project for an admin; yours for a user.")
PROJECT_DETAIL = Listing("project show", PROJECTS.fields, note="One project, as one object.")

USER_TOKENS = Listing("token ls: a user's tokens", {
    "id": "the token's id (tk-…): what `tidal token rotate` and `revoke` take; never the token itself",
    "user": "the user whose token it is",
    "label": "its label (--label; null: none)",
    "created_at": "when it was made (Unix time)",
    "created_by": "who made it (null: the control plane itself: `tidal up`'s, a node's join, an older version's)",
    "expires_at": "when it expires (Unix time; null: never, until revoked)",
    "last_used_at": "when it was last used, to within a minute (Unix time; null: not yet)",
    "revoked_at": "when it was revoked (Unix time; null: it was not)",
    "state": "active, expired or revoked",
}, (
    Column("ID", _text("id")),
    Column("USER", _text("user")),
    Column("LABEL", _text("label")),
    Column("STATE", _text("state"), style=lambda r: "green" if r["state"] == "active" else "dim"),
    Column("CREATED", lambda r: units.ago(r["created_at"])),
    Column("CREATED BY", _text("created_by"), wide=True),
    Column("EXPIRES", lambda r: units.ago(r["expires_at"]) if r["expires_at"] is not None else "never"),
    Column("LAST USED", lambda r: units.ago(r["last_used_at"])),
    Column("REVOKED", lambda r: units.ago(r["revoked_at"]), wide=True),
), note="A user's API tokens, oldest first: yours, or as an admin anyone's (`tidal token ls` without --user "
        "lists yours too, unless you are an admin: then the join tokens and the agents' credentials).")

LISTINGS = {x.command: x for x in (JOBS, JOB_DETAIL, PLACEMENT, CHECKPOINTS, EVENTS, NODES, NODE_GPUS, NODE_LINKS,
                                   TOKENS, USER_TOKENS, USERS, USER_DETAIL, WHOAMI, PROJECTS, PROJECT_DETAIL,
                                   PROCESSES, CHECKS,
                                   STORE_USAGE, STORE_USERS, STORE_JOBS)}
"""Every command's listing, by command (``ls``, ``token ls``; ``show: placement`` for a part of one): what
docs/cli.md documents."""
