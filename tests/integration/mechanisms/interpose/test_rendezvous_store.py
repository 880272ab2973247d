"""The control plane's rendezvous store outlives the control plane: ranks restored while it was killed
rebuild their process group on the address they were given, and the next control plane adopts the store,
keys and all."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from tidal.errors import MechanismError
from tidal.mechanisms.interpose import storeserver
from tidal.testing import wait_until

pytestmark = pytest.mark.torch

# A stand-in for the control plane: it holds the state directory, starts (or adopts) the store, says
# where it is, and waits to be killed.
PLANE = ("import sys, time; from pathlib import Path; from tidal.mechanisms.interpose import storeserver as s; "
         "s.hold(Path(sys.argv[1]), int(sys.argv[2])); r = s.shared(); print(r.pid, r.addr, flush=True); "
         "time.sleep(600)")


def _plane(home: Path, port: int = 0) -> tuple[subprocess.Popen[str], int, str]:
    p = subprocess.Popen([sys.executable, "-c", PLANE, str(home), str(port)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    pid, addr = p.stdout.readline().split()
    return p, int(pid), addr


def test_store_survives_a_killed_control_plane_and_is_adopted(tmp_path: Path) -> None:
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    first, pid, addr = _plane(tmp_path)
    try:
        host, port = addr.rsplit(":", 1)
        rank = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
        rank.set("job/1/start/key", "seen before the control plane died")
        first.send_signal(signal.SIGKILL)
        first.wait()
        assert storeserver._is_store_server(pid)  # no owner for a while: it waits for the next one
        rank.set("job/1/start/other", "meanwhile")

        second, pid2, addr2 = _plane(tmp_path)
        try:
            assert (pid2, addr2) == (pid, addr)
            assert rank.get("job/1/start/key") == b"seen before the control plane died"
            assert rank.get("job/1/start/other") == b"meanwhile"
        finally:
            second.kill()
            second.wait()
    finally:
        first.kill()
        storeserver.stop_recorded(tmp_path)  # as `tidal down` does
    wait_until(lambda: not storeserver._is_store_server(pid), timeout=10, what=f"the store server {pid} to end")


def test_store_of_a_control_plane_that_left_ends_after_its_grace(tmp_path: Path) -> None:
    lifeline = tmp_path / storeserver.STATE
    lifeline.touch()
    p = subprocess.Popen([sys.executable, "-m", "tidal.mechanisms.interpose.storeserver", "--lifeline",
                          str(lifeline), "--grace", "1"], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip().isdigit()
    assert p.wait(20) == 0  # nobody holds the lifeline: gone a second later
    os.remove(lifeline)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_store_listens_on_the_port_it_is_given(tmp_path: Path) -> None:
    """--rendezvous-port: firewall rules name the port, so the store takes that one, not a free one."""
    port = _free_port()
    plane, pid, addr = _plane(tmp_path, port)
    try:
        assert addr == f"127.0.0.1:{port}"
        assert json.loads((tmp_path / storeserver.STATE).read_text()) == {"pid": pid, "port": port}
    finally:
        plane.kill()
        plane.wait()
        storeserver.stop_recorded(tmp_path)
    wait_until(lambda: not storeserver._is_store_server(pid), timeout=10, what=f"the store server {pid} to end")


def test_a_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = subprocess.run([sys.executable, "-c", PLANE, str(tmp_path), str(port)], capture_output=True, text=True,
                           timeout=60)
    assert p.returncode != 0
    assert f"MechanismError: the rendezvous store cannot listen on port {port}:" in p.stderr, p.stderr


def test_a_port_out_of_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MechanismError, match="rendezvous store port 70000: from 1 to 65535"):
        storeserver.hold(tmp_path, 70000)
