"""Ranks run under their owner's Unix account: a job of one user cannot read another user's checkpoint
images or the API tokens, even where the state directory itself can be traversed."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from tidal.config import Settings
from tidal.control.localcluster import down
from tidal.testing import wait_until

pytestmark = pytest.mark.criu


def test_a_job_cannot_read_other_users_checkpoints_or_tokens(make_cluster) -> None:
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="tidal-sec-", dir="/tmp"))
    try:
        base.chmod(0o755)
        home = base / "home"
        home.mkdir(mode=0o755)  # deliberately traversable: the files themselves must protect themselves
        c = make_cluster(nodes=1, devices=1, home=home)
        alice_wd = base / "alice"
        alice_wd.mkdir(mode=0o700)
        alice = c.cli("submit", "-q", "--", "sh", "-c", "echo secret > notes.txt; sleep 300",
                      cwd=alice_wd).stdout.strip()
        c.wait_state(alice, "running")
        wait_until(lambda: (alice_wd / "notes.txt").exists(), timeout=30, what="alice's file")
        c.cli("preempt", alice)
        manifests = list((home / "checkpoints").rglob("manifest.json"))
        chunks = [p for p in (home / "checkpoints").rglob("*") if p.is_file() and "chunks" in p.parts]
        assert manifests and chunks

        with c.api("admin") as api:
            r = api.post("/v1/users", json={"name": "bob", "role": "user", "unix_user": "nobody"})
            assert r.status_code == 201, r.text
            bob = r.json()["token"]
            bad = api.post("/v1/users", json={"name": "eve", "unix_user": "no-such-account"})
            assert bad.status_code == 422 and bad.json()["field"] == "unix_user"
        bob_wd = base / "bob"
        bob_wd.mkdir()
        os.chown(bob_wd, nobody.pw_uid, nobody.pw_gid)
        targets = [home / "tokens" / "user.token", home / "tokens" / "admin.token",
                   home / "tokens" / "cluster.token", manifests[0], chunks[0], alice_wd / "notes.txt"]
        script = "id -u; " + " ".join(f"if cat {t} >/dev/null 2>&1; then echo READ {t}; else echo denied; fi;"
                                       for t in targets)
        job = c.cli("submit", "-q", "--", "sh", "-c", script, cwd=bob_wd,
                    env={"TIDAL_TOKEN": bob}).stdout.strip()
        assert c.cli("wait", job, check=False, env={"TIDAL_TOKEN": bob}).returncode == 0
        out = c.cli("logs", job, env={"TIDAL_TOKEN": bob}).stdout.split()
        assert out[0] == str(nobody.pw_uid)
        assert out[1:] == ["denied"] * len(targets), out
        c.cli("cancel", alice)
    finally:
        down(Settings(home=base / "home"))  # before its state directory goes
        shutil.rmtree(base, ignore_errors=True)


def test_a_jobs_environment_never_reaches_code_that_runs_as_root(make_cluster) -> None:
    # The exploit: a job of an ordinary account puts its own `setpriv` (and python, sh, env...) first on its
    # PATH, and sets LD_PRELOAD/PYTHONPATH, hoping the launcher runs one of them as root before dropping
    # privileges. Whatever of the job's runs as root writes into a directory only root may write.
    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="tidal-sec-", dir="/tmp"))
    try:
        base.chmod(0o755)
        c = make_cluster(nodes=1, devices=1, home=base / "home")
        root_only = base / "root-only"
        root_only.mkdir(mode=0o700)
        proof = root_only / "pwned"
        evil = base / "evil-bin"
        evil.mkdir(mode=0o755)
        for name in ("setpriv", "python3", "python", "sh", "env", "unshare", "setsid", "criu", "id"):
            prog = evil / name
            prog.write_text(f"#!/bin/sh\n/usr/bin/id -u >> {proof}\nexec /usr/bin/{name} \"$@\"\n")
            prog.chmod(0o755)
        wd = base / "mallory"
        wd.mkdir()
        os.chown(wd, nobody.pw_uid, nobody.pw_gid)
        with c.api("admin") as api:
            r = api.post("/v1/users", json={"name": "mallory", "role": "user", "unix_user": "nobody"})
            assert r.status_code == 201, r.text
        mallory = {"TIDAL_TOKEN": r.json()["token"]}
        spec = wd / "job.yaml"
        spec.write_text(
            "command: [id, -u]\n"
            f"env:\n  PATH: {evil}:/usr/bin:/bin\n  LD_PRELOAD: {evil}/none.so\n  PYTHONPATH: {evil}\n")
        job = c.cli("submit", "-q", "-f", str(spec), cwd=wd, env=mallory).stdout.strip()
        assert c.cli("wait", job, check=False, env=mallory).returncode == 0
        out = [ln for ln in c.cli("logs", job, env=mallory).stdout.splitlines() if not ln.startswith("ERROR: ld.so")]
        # The job's own `id` (first on its PATH) ran, as nobody, and could not write the proof: the job's
        # environment was in force in the job...
        assert out == [f"{evil}/id: 2: cannot create {proof}: Permission denied", str(nobody.pw_uid)]
        # ...and nothing of it ran as root.
        assert not proof.exists(), proof.read_text()
    finally:
        down(Settings(home=base / "home"))
        shutil.rmtree(base, ignore_errors=True)
