"""Limits on what a user or an agent may ask of the control plane.

Every request is bounded so that no single caller can make the control plane allocate without end or
store what it cannot serve back: these are far above any real job or node, and low enough that the
largest request costs little. docs/cluster.md (Request limits) lists them for users.
"""

from __future__ import annotations

# -- a job's specification ------------------------------------------------------------------------------
MAX_RANKS = 4096  # world size W (and so devices, min_devices, max_devices)
MAX_RESTARTS = 1000
MAX_CHECKPOINT_EVERY_S = 30 * 86400.0  # a longer interval: submit without periodic checkpoints
MAX_RUNTIME_S = 365 * 86400.0  # a job's expected run time (for SLA admission)
MAX_NAME_CHARS = 256  # a job's name
MAX_PROJECT_CHARS = 64
MAX_WORKDIR_BYTES = 4096  # PATH_MAX
MAX_COMMAND_ARGS = 4096
MAX_ARG_BYTES = 128 * 1024  # Linux's MAX_ARG_STRLEN: exec refuses a longer argument
MAX_COMMAND_BYTES = 256 * 1024
MAX_ENV_VARS = 1024
MAX_ENV_NAME_BYTES = 256
MAX_ENV_VALUE_BYTES = 64 * 1024
MAX_ENV_BYTES = 256 * 1024  # every NAME=VALUE of the job's environment together

# -- nodes and what their agents report -------------------------------------------------------------------
MAX_NODES = 10_000  # nodes known to one control plane
MAX_DEVICES_PER_NODE = 256
MAX_CLUSTER_DEVICES = 100_000  # devices of the nodes that are up, together
MAX_CPU_ID = 8191  # the kernel's largest NR_CPUS is 8192
MAX_NODE_NAME_CHARS = 128
MAX_ID_CHARS = 64  # agent ids, action ids, region and cluster names, user names
MAX_HEARTBEAT_JOBS = 1024  # jobs one heartbeat reports on
MAX_PROGRESS_FIGURES = 32  # figures per job in a heartbeat
MAX_LOG_OFFSET = 1 << 40  # 1 TiB: where an uploaded log chunk may start
# A consistent cut over several nodes: the communicators (process groups, point-to-point pairs per tag) of
# one job a node reports or an order names, their names, and their members all together (so that a report
# stays well within a request body).
MAX_COMMUNICATORS = 4096
MAX_COMMUNICATOR_CHARS = 128
MAX_CUT_MEMBERS = 65_536

# -- requests -------------------------------------------------------------------------------------------------
MAX_BODY_BYTES = 1 << 20  # any request body, except a log upload
MAX_LOG_UPLOAD_BYTES = 16 << 20  # a log chunk from an agent (agents send 4 MiB)
MAX_LOG_READ_BYTES = 4 << 20  # bytes of a log one GET returns (the client asks again from there)
MAX_PAGE = 10_000  # events or jobs in one listing
MAX_BULK = 1000  # jobs one bulk request (cancel, preempt) acts on
MAX_JOB_EVENTS_SHOWN = 1000  # a job's latest events in `GET /v1/jobs/{id}`
MAX_POLL_WAIT_S = 30.0  # an agent's long-poll for actions
