"""The control plane's rendezvous store outlives the control plane: ranks restored while it was killed
rebuild their process group on the address they were given, and the next control plane adopts the store,
keys and all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from tidal.mechanisms.interpose import storeserver
from tidal.testing import wait_until

pytestmark = pytest.mark.torch

# A stand-in for the control plane: it holds the state directory, starts (or adopts) the store, says
# where it is, and waits to be killed.
PLANE = ("import sys, time; from pathlib import Path; from tidal.mechanisms.interpose import storeserver as s; "
         "s.hold(Path(sys.argv[1])); r = s.shared(); print(r.pid, r.addr, flush=True); time.sleep(600)")


def _plane(home: Path) -> tuple[subprocess.Popen[str], int, str]:
    p = subprocess.Popen([sys.executable, "-c", PLANE, str(home)], stdout=subprocess.PIPE, text=True)
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
