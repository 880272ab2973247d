"""The agent's prestages without a store: what a prestage fetched goes only to the restore of the same job's
next attempt, and only the ranks it restores; anything else drops it (another attempt, an unstage, the end of
the lease, the time limit), including images that arrive after the prestage was dropped."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from tidal.agent.prestaging import Prestages
from tidal.errors import Conflict
from tidal.testing import wait_until


class Images:
    """Stands for a rank's fetched images (a LastDump): all a prestage does with them is drop or hand over."""

    def __init__(self) -> None:
        self.dropped = False

    def drop(self) -> None:
        self.dropped = True


def fetched(*ranks: int) -> dict[int, Any]:
    return {r: Images() for r in ranks}


def prestage(ps: Prestages, job: str, attempt: int, checkpoint: str, fetch: Any) -> None:
    """As the executor does: expected when its order is queued, fetched in its turn."""
    ps.expect(job, attempt, checkpoint)
    ps.fetch(job, attempt, checkpoint, fetch)


def test_the_next_attempts_restore_takes_its_ranks_and_the_others_are_dropped() -> None:
    ps = Prestages()
    images = fetched(0, 1)
    prestage(ps, "j1", 4, "ck-3", lambda: images)
    taken = ps.take("j1", 5, [1])
    assert taken is not None and taken[0] == "ck-3" and taken[1] == {1: images[1]}
    assert images[0].dropped and not images[1].dropped  # the restore consumes rank 1's
    assert ps.take("j1", 5, [1]) is None  # once only


def test_a_restore_of_another_attempt_or_job_gets_nothing_and_the_images_go() -> None:
    ps = Prestages()
    images = fetched(0)
    prestage(ps, "j1", 4, "ck-3", lambda: images)
    assert ps.take("j2", 5, [0]) is None and not images[0].dropped
    assert ps.take("j1", 7, [0]) is None and images[0].dropped


def test_an_unstage_drops_the_prestage_of_its_attempt_not_a_newer_one() -> None:
    ps = Prestages()
    images = fetched(0)
    prestage(ps, "j1", 4, "ck-3", lambda: images)
    assert not ps.drop("j1", 3) and not images[0].dropped
    assert ps.drop("j1", 4) and images[0].dropped
    assert ps.take("j1", 5, [0]) is None


def test_a_newer_prestage_of_the_job_replaces_the_older() -> None:
    ps = Prestages()
    old, new = fetched(0), fetched(0)
    prestage(ps, "j1", 4, "ck-3", lambda: old)
    prestage(ps, "j1", 6, "ck-5", lambda: new)
    assert old[0].dropped
    taken = ps.take("j1", 7, [0])
    assert taken == ("ck-5", new)


def test_untaken_images_expire() -> None:
    ps = Prestages(ttl=0.05)
    images = fetched(0)
    prestage(ps, "j1", 4, "ck-3", lambda: images)
    wait_until(lambda: images[0].dropped, timeout=5, what="the images to expire")
    assert ps.take("j1", 5, [0]) is None


def gated(images: dict[int, Any]) -> tuple[threading.Event, Callable[[], dict[int, Any]]]:
    """A fetch that returns ``images`` once the event it comes with is set."""
    go = threading.Event()

    def slow() -> dict[int, Any]:
        go.wait(10)
        return images

    return go, slow


def test_a_restore_waits_for_a_prestage_under_way() -> None:
    ps = Prestages()
    images = fetched(0)
    go, slow = gated(images)
    ps.expect("j1", 4, "ck-3")
    t = threading.Thread(target=ps.fetch, args=("j1", 4, "ck-3", slow))
    t.start()
    got: list[Any] = []
    r = threading.Thread(target=lambda: got.append(ps.take("j1", 5, [0])))
    r.start()
    r.join(0.2)
    assert r.is_alive()  # waiting for the fetch
    go.set()
    r.join(10)
    t.join(10)
    assert got == [("ck-3", images)]


def test_images_fetched_after_the_lease_ended_are_dropped_on_arrival() -> None:
    ps = Prestages()
    images = fetched(0)
    go, slow = gated(images)
    ps.expect("j1", 4, "ck-3")
    t = threading.Thread(target=ps.fetch, args=("j1", 4, "ck-3", slow))
    t.start()
    ps.drop_all()
    go.set()
    t.join(10)
    assert images[0].dropped and ps.take("j1", 5, [0]) is None


def test_a_failed_fetch_leaves_nothing() -> None:
    ps = Prestages()

    def broken() -> dict[int, Any]:
        raise OSError("store unreachable")

    with pytest.raises(OSError):
        prestage(ps, "j1", 4, "ck-3", broken)
    assert ps.take("j1", 5, [0]) is None


def test_a_restore_that_comes_before_the_prestage_began_waits_for_it() -> None:
    ps = Prestages()
    ps.expect("j1", 4, "ck-3")  # queued, not begun
    got: list[Any] = []
    r = threading.Thread(target=lambda: got.append(ps.take("j1", 5, [0])))
    r.start()
    r.join(0.2)
    assert r.is_alive()
    images = fetched(0)
    ps.fetch("j1", 4, "ck-3", lambda: images)
    r.join(10)
    assert got == [("ck-3", images)]


def test_a_prestage_dropped_or_replaced_before_it_began_does_not_fetch() -> None:
    ps = Prestages()
    ps.expect("j1", 4, "ck-3")
    assert ps.drop("j1", 4)
    with pytest.raises(Conflict):
        ps.fetch("j1", 4, "ck-3", lambda: pytest.fail("fetched"))
    ps.expect("j1", 4, "ck-3")
    ps.expect("j1", 6, "ck-5")
    with pytest.raises(Conflict):
        ps.fetch("j1", 4, "ck-3", lambda: pytest.fail("fetched"))


def test_images_kept_from_the_nodes_own_dump_replace_a_prestage_and_go_to_the_next_restore() -> None:
    """A checkpoint that kills the job for a restore here keeps its images (``put``): a prestage of an older
    checkpoint expected meanwhile is dropped, and the next attempt's restore takes the kept ones."""
    ps = Prestages()
    ps.expect("j1", 4, "ck-2")
    kept = fetched(0, 1)
    ps.put("j1", 4, "ck-3", kept)
    calls: list[int] = []
    with pytest.raises(Conflict, match="dropped or replaced"):  # its turn comes after: nothing is fetched
        ps.fetch("j1", 4, "ck-2", lambda: calls.append(1) or fetched(0))
    assert calls == []
    taken = ps.take("j1", 5, [0, 1])
    assert taken == ("ck-3", kept) and not any(i.dropped for i in kept.values())


def test_kept_images_go_when_no_restore_takes_them_in_time() -> None:
    ps = Prestages(ttl=0.05)
    kept = fetched(0)
    ps.put("j1", 4, "ck-3", kept)
    wait_until(lambda: kept[0].dropped, timeout=5, what="the kept images to expire")
    assert ps.take("j1", 5, [0]) is None
