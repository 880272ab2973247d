"""A rank's command runs as the job's account with the job's environment; the rank's init, which stays root,
sees neither (a job must not choose the code that runs as root). Jobs of ordinary accounts checkpoint,
restore and move like root's."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from pathlib import Path

import pytest

from tests.integration.ranks import Cluster, reference_run
from tidal.mechanisms.accounts import Account
from tidal.mechanisms.criu.job import Job
from tidal.mechanisms.criu.rank import INIT_ENV, RankProcess, RankSpec
from tidal.testing import owned_dir, wait_for_line, wait_until

NOBODY = pwd.getpwnam("nobody")


def _evil_bin(cluster: Cluster, proof: Path) -> Path:
    """Programs a job might plant on its PATH: whatever runs them as root leaves ``proof`` behind."""
    bin_dir = cluster.root / "evil-bin"
    bin_dir.mkdir(mode=0o755)
    for name in ("setpriv", "python3", "python", "sh", "env", "unshare", "setsid"):
        prog = bin_dir / name
        prog.write_text(f"#!/bin/sh\nid -u >> {proof}\nexec /usr/bin/{name} \"$@\"\n")
        prog.chmod(0o755)
    return bin_dir


def test_the_init_runs_with_a_fixed_environment_and_the_command_as_the_account(cluster: Cluster,
                                                                              shared_tmp: Path) -> None:
    wd = owned_dir(shared_tmp / "work", "nobody")
    root_only = cluster.root / "root-only"
    root_only.mkdir(mode=0o700)
    proof = root_only / "ran-as-root"
    evil = _evil_bin(cluster, proof)
    env = {"PATH": f"{evil}:/usr/bin:/bin", "LD_PRELOAD": "/nonexistent/evil.so", "PYTHONPATH": str(evil),
           "LD_LIBRARY_PATH": str(evil), "JOB_VAR": "from the job"}
    argv = ["/bin/sh", "-c", 'id -u; id -G; echo "$JOB_VAR"; pwd; cat /proc/1/environ >/dev/null 2>&1 '
            '&& echo can-read-init-env || echo init-env-denied; exec sleep 300']
    spec = RankSpec("acct", 0, tuple(argv), wd, env, interpose=False, account=Account.named("nobody"))
    rank = RankProcess.launch(spec, cluster.nodes[0])
    try:
        wait_for_line(cluster.nodes[0].log_path(spec), r"^init-env-denied$|^can-read-init-env$")
        init_env = dict(kv.split("=", 1) for kv in
                        Path(f"/proc/{rank.pid}/environ").read_text().split("\0") if kv)
        assert init_env == INIT_ENV
        assert Path(f"/proc/{rank.pid}/cwd").resolve() == Path("/")
        assert os.stat(f"/proc/{rank.pid}").st_uid == 0  # the init stays root: CRIU needs it
        children = [int(c) for c in Path(f"/proc/{rank.pid}/task/{rank.pid}/children").read_text().split()]
        (cmd,) = children
        status = Path(f"/proc/{cmd}/status").read_text()
        ids = {ln.split(":")[0]: ln.split()[1:] for ln in status.splitlines() if ln.startswith(("Uid", "Gid"))}
        assert ids["Uid"] == [str(NOBODY.pw_uid)] * 4 and ids["Gid"] == [str(NOBODY.pw_gid)] * 4
        cmd_env = Path(f"/proc/{cmd}/environ").read_bytes().split(b"\0")
        assert b"JOB_VAR=from the job" in cmd_env and b"LD_PRELOAD=/nonexistent/evil.so" in cmd_env
        # The loader complains in each of the job's processes, none of the init's: it is the job's preload.
        lines = [ln for ln in cluster.nodes[0].log_path(spec).read_text().splitlines()
                 if not ln.startswith("ERROR: ld.so: object '/nonexistent/evil.so'")]
        assert lines[0] == str(NOBODY.pw_uid)
        assert lines[1].split() == [str(g) for g in os.getgrouplist("nobody", NOBODY.pw_gid)]
        assert lines[2:] == ["from the job", str(wd), "init-env-denied"]
        assert not proof.exists(), f"a program of the job's PATH ran as root: {proof.read_text()}"
    finally:
        rank.kill()


def test_a_working_directory_the_account_cannot_enter_fails_the_rank(cluster: Cluster) -> None:
    private = cluster.root / "root-private"
    private.mkdir(mode=0o700)
    spec = RankSpec("acct", 0, ("/bin/true",), private, {}, interpose=False, account=Account.named("nobody"))
    rank = RankProcess.launch(spec, cluster.nodes[0])
    assert rank.wait(30).code == 126
    assert "Permission denied" in cluster.nodes[0].log_path(spec).read_text()


LOOP = ["sh", "-c", 'i=0; while [ $i -lt 80 ]; do i=$((i+1)); echo "tick $i" | tee -a ticks.txt; sleep 0.02; '
        "done; echo done"]


@pytest.mark.parametrize("lazy", [True, False])
def test_a_job_of_an_ordinary_account_checkpoints_restores_and_migrates(cluster: Cluster, shared_tmp: Path,
                                                                       lazy: bool) -> None:
    wd = owned_dir(shared_tmp / "work", "nobody")
    spec = RankSpec("job", 0, tuple(LOOP), wd, cluster.spec(LOOP).env, account=Account.named("nobody"))
    ref_dir = cluster.root / "ref"
    ref = reference_run(LOOP, ref_dir, spec.launch_env())
    job = Job.launch("job", [(spec, cluster.nodes[0])], cluster.store)
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 10$")
    job.checkpoint(then="continue")
    wait_for_line(cluster.nodes[0].log_path(spec), r"^tick 20$")
    job.checkpoint(then="kill")
    job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[1])], lazy=lazy)
    wait_for_line(cluster.nodes[1].log_path(spec), r"^tick 40$")
    job.checkpoint(then="kill")
    job = Job.restore(cluster.store, "job", [(spec, cluster.nodes[2])], lazy=lazy)
    wait_until(lambda: all(not r.running for r in job.ranks), timeout=60, what="the job's end", interval=0.01)
    assert [s.code for s in job.wait(60)] == [0]
    assert cluster.nodes[2].log_path(spec).read_bytes() == ref
    assert (wd / "ticks.txt").read_bytes() == (ref_dir / "ticks.txt").read_bytes()
    st = (wd / "ticks.txt").stat()
    assert (st.st_uid, st.st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert stat.S_IMODE(st.st_mode) & 0o200


def test_the_working_directory_is_captured_as_the_account_not_as_root(shared_tmp: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # A job swaps a directory for a symlink into root's files between the scan and the copy: read as the
    # account, the copy fails instead of putting root's file into the job's checkpoint.
    from tidal.mechanisms.criu import fsstate

    wd = owned_dir(shared_tmp / "work", "nobody")
    tracker = fsstate.FsTracker.at_launch(wd, Account.named("nobody"))
    vault = tmp_path / "vault"  # pytest's directories: root's alone
    vault.mkdir(mode=0o700)
    (vault / "out.txt").write_text("root's secret\n")
    (wd / "data").mkdir()
    (wd / "data" / "out.txt").write_text("job output\n")
    before = fsstate.scan(wd)
    shutil.rmtree(wd / "data")
    (wd / "data").symlink_to(vault)
    monkeypatch.setattr(fsstate, "scan", lambda _root, *_ignored: before)
    staging = tmp_path / "staging"
    with pytest.raises(PermissionError):
        tracker.capture(staging)
    assert not (staging / "data" / "out.txt").exists()
