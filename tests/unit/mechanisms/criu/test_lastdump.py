"""A job's waiter and its killer may drop the kept dump at the same time."""

from __future__ import annotations

import threading
from pathlib import Path

from tidal.mechanisms.criu.lastdump import LastDump


def test_concurrent_drops(tmp_path: Path) -> None:
    (tmp_path / "kept").mkdir()
    for i in range(50):
        images = tmp_path / f"img-{i}"
        images.mkdir()
        (images / "core-1.img").write_bytes(b"x")
        last = LastDump()
        last.keep(images, {}, tmp_path / "kept" / f"last-{i}")
        assert last.dir is not None and last.dir.exists()
        errors: list[BaseException] = []

        def drop(last: LastDump = last, errors: list[BaseException] = errors) -> None:
            try:
                last.drop()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=drop) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and last.dir is None
        assert not (tmp_path / "kept" / f"last-{i}").exists()
        (tmp_path / "kept").mkdir(exist_ok=True)  # the last drop removes the emptied parent
