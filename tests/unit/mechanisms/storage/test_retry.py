"""Retries of remote store requests: which failures are tried again, how long between tries, when it stops,
and a store over a fake fsspec filesystem that drops requests; a store that does not answer, named as the one a
replication could not read from."""

from __future__ import annotations

import errno
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from tidal.errors import StorageError, StoreUnreachable
from tidal.mechanisms.storage import CheckpointStore
from tidal.mechanisms.storage.replicate import replicate
from tidal.mechanisms.storage.retry import RetryPolicy, answer, reading_from, retrying, transient

FAST = RetryPolicy(attempts=4, base=0.001, cap=0.002)


class ClientError(Exception):
    """Shaped like botocore's: the server's answer in ``response``."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(f"An error occurred ({code})")
        self.response = {"ResponseMetadata": {"HTTPStatusCode": status}, "Error": {"Code": code}}


#: botocore's ConnectionError is its own class, not the builtin: only its name says what it is.
BotoConnectionError = type("ConnectionError", (Exception,), {})


class EndpointConnectionError(BotoConnectionError):  # type: ignore[misc,valid-type]
    """Named like botocore's, with botocore's ConnectionError above it."""


def translated(status: int, code: str) -> OSError:
    """What s3fs raises for a ClientError: an OSError whose cause is the ClientError."""
    e = OSError(errno.EIO, code)
    e.__cause__ = ClientError(status, code)
    return e


@pytest.mark.parametrize("exc", [
    ConnectionRefusedError(), ConnectionResetError(), TimeoutError(), EndpointConnectionError("down"),
    ClientError(500, "InternalError"), ClientError(503, "SlowDown"), ClientError(400, "RequestTimeout"),
    ClientError(429, "TooManyRequests"), ClientError(400, "BadDigest"), translated(503, "ServiceUnavailable"),
])
def test_transient_failures(exc: BaseException) -> None:
    assert transient(exc)


@pytest.mark.parametrize("exc", [
    FileNotFoundError(), PermissionError(), ValueError(), ClientError(403, "AccessDenied"),
    ClientError(404, "NoSuchBucket"), translated(403, "InvalidAccessKeyId"), translated(400, "InvalidArgument"),
])
def test_permanent_failures(exc: BaseException) -> None:
    assert not transient(exc)


def test_answer_reads_the_status_behind_a_translated_error() -> None:
    assert answer(translated(503, "SlowDown")) == (503, "SlowDown")
    assert answer(ConnectionResetError()) == (None, None)


def test_pauses_grow_and_are_bounded() -> None:
    p = RetryPolicy(attempts=6, base=0.25, cap=8.0)
    for k in range(1, 10):
        full = min(8.0, 0.25 * 2 ** (k - 1))
        assert all(full / 2 <= p.pause(k) <= full for _ in range(20))
    assert p.longest() == 0.25 + 0.5 + 1 + 2 + 4


def test_retrying_tries_again_then_succeeds() -> None:
    calls, pauses = [], []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    p = RetryPolicy(attempts=5, base=0.1, cap=1.0)
    assert retrying(flaky, p, "writing", "s3://b/k", hint="h", sleep=pauses.append) == "ok"
    assert len(calls) == 3
    assert len(pauses) == 2 and 0.05 <= pauses[0] <= 0.1 and 0.1 <= pauses[1] <= 0.2


def test_retrying_gives_up_with_a_storage_error_that_says_what_failed() -> None:
    calls = []

    def down() -> None:
        calls.append(1)
        raise translated(503, "ServiceUnavailable")

    with pytest.raises(StorageError) as err:
        retrying(down, FAST, "writing", "s3://b/chunks/ab/abc", hint="check the store", sleep=lambda _: None)
    assert len(calls) == 4
    e = err.value
    assert "writing s3://b/chunks/ab/abc" in e.message and "ServiceUnavailable" in e.message
    assert "tried 4 times" in e.message and e.hint == "check the store"
    assert e.fields == {"object": "s3://b/chunks/ab/abc", "reason": "unavailable", "attempts": 4}
    assert isinstance(e.__cause__, OSError)


def test_retrying_does_not_retry_what_cannot_succeed() -> None:
    calls = []

    def denied() -> None:
        calls.append(1)
        raise PermissionError("Access Denied")

    with pytest.raises(PermissionError):
        retrying(denied, FAST, "writing", "k", hint="h", sleep=lambda _: None)
    assert len(calls) == 1


#: Named like aiohttp's: a failure on an open connection, and (a subclass) one that could not be made.
ClientOSError = type("ClientOSError", (ConnectionResetError,), {})
ClientConnectorError = type("ClientConnectorError", (ClientOSError,), {})


def broken(cls: type[BaseException]) -> EndpointConnectionError:
    """botocore's wrapping of an aiohttp failure: the aiohttp exception is the cause."""
    e = EndpointConnectionError("Could not connect to the endpoint URL")
    e.__cause__ = cls("Connection reset by peer")
    return e


def test_kept_connections_that_broke_are_tried_again_at_once_and_not_counted() -> None:
    # Ten dead connections in the pool, then a fresh one: two counted tries would not have reached it.
    calls, pauses = [], []

    def pooled() -> str:
        calls.append(1)
        if len(calls) <= 10:
            raise broken(ClientOSError)
        return "ok"

    p = RetryPolicy(attempts=2, base=0.1, cap=1.0)
    assert retrying(pooled, p, "reading", "s3://b/k", hint="h", sleep=pauses.append) == "ok"
    assert len(calls) == 11 and pauses == []


def test_connections_that_could_not_be_made_count_and_free_tries_are_bounded() -> None:
    calls = []

    def refused() -> None:
        calls.append(1)
        raise broken(ClientConnectorError)

    with pytest.raises(StorageError, match="tried 4 times"):
        retrying(refused, FAST, "reading", "k", hint="h", sleep=lambda _: None)
    assert len(calls) == 4
    calls.clear()

    def always_broken() -> None:
        calls.append(1)
        raise broken(ClientOSError)

    p = RetryPolicy(attempts=3, base=0.001, cap=0.002, stale=5)
    with pytest.raises(StorageError, match="tried 3 times"):
        retrying(always_broken, p, "reading", "k", hint="h", sleep=lambda _: None)
    assert len(calls) == 5 + 3


class FlakyFileSystem(MemoryFileSystem):
    """A memory filesystem whose requests fail on the way: the first ``fail_first`` of each kind, or every
    one while ``down``."""

    protocol = "flaky"
    fail_first = 0
    down = False
    failures: dict[str, int] = {}  # noqa: RUF012 - shared by the instances of one test

    def _fault(self, op: str) -> None:
        n = self.failures.get(op, 0)
        if self.down or n < self.fail_first:
            self.failures[op] = n + 1
            raise ConnectionResetError(f"{op}: connection reset by peer")

    def pipe_file(self, path: str, value: Any, *args: Any, **kwargs: Any) -> Any:
        self._fault("put")
        return super().pipe_file(path, value, *args, **kwargs)

    def cat_file(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._fault("get")
        return super().cat_file(path, *args, **kwargs)

    def ls(self, path: str, *args: Any, **kwargs: Any) -> Any:
        self._fault("ls")
        return super().ls(path, *args, **kwargs)


@pytest.fixture
def flaky() -> Iterator[type[FlakyFileSystem]]:
    fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)
    FlakyFileSystem.failures = {}
    FlakyFileSystem.fail_first, FlakyFileSystem.down = 0, False
    yield FlakyFileSystem
    FlakyFileSystem.fail_first, FlakyFileSystem.down = 0, False


def test_store_rides_out_dropped_requests(flaky: type[FlakyFileSystem]) -> None:
    flaky.fail_first = 2  # every kind of request fails twice, then works
    store = CheckpointStore(f"flaky://t-{uuid.uuid4().hex}", chunk_size=4096, retry=FAST)
    data = bytes(range(256)) * 100
    w = store.writer("job")
    w.add_bytes("f", data)
    info = w.commit({})
    assert store.reader("job", info.id).read_bytes("f") == data
    assert flaky.failures == {"put": 2, "get": 2, "ls": 2}
    store.close()


def test_store_down_fails_with_storage_error_and_commits_nothing(flaky: type[FlakyFileSystem]) -> None:
    store = CheckpointStore(f"flaky://t-{uuid.uuid4().hex}", chunk_size=4096, retry=FAST)
    w = store.writer("job")
    w.add_bytes("f", b"first")
    good = w.commit({})
    w = store.writer("job")
    flaky.down = True
    with pytest.raises(StorageError) as err:
        w.add_bytes("f", b"x" * 10000)
    assert "tried 4 times" in err.value.message and "connection reset" in err.value.message
    assert err.value.fields["reason"] == "unavailable"
    flaky.down = False
    w.abort()
    assert store.list("job") == [good]
    assert store.reader("job", good.id).read_bytes("f") == b"first"
    store.close()


def test_reads_from_a_store_that_does_not_answer_name_it() -> None:
    down = StorageError("checkpoint store error reading s3://b/k: ConnectionRefusedError (tried 6 times in 5.8 s)",
                        object="s3://b/k", reason="unavailable")
    with pytest.raises(StoreUnreachable) as err, reading_from("s3://b"):
        raise down
    assert err.value.message == ("the checkpoint store s3://b cannot be reached: checkpoint store error reading "
                                 "s3://b/k: ConnectionRefusedError (tried 6 times in 5.8 s)")
    assert err.value.fields == {"store": "s3://b", "object": "s3://b/k", "reason": "unavailable"}
    assert err.value.__cause__ is down
    denied = StorageError("checkpoint store refused reading s3://b/k: access denied", reason="access denied")
    with pytest.raises(StorageError) as other, reading_from("s3://b"):
        raise denied
    assert other.value is denied  # an answer, not silence: the store is there


def test_a_replication_whose_source_does_not_answer_says_so(flaky: type[FlakyFileSystem], tmp_path: Path) -> None:
    """Told apart from a damaged source (CheckpointCorrupt): the source named, whether it fell silent before the
    manifest was read or during the copy of the chunks."""
    source = CheckpointStore(f"flaky://src-{uuid.uuid4().hex}", chunk_size=4096, retry=FAST)
    w = source.writer("job")
    w.add_bytes("f", bytes(range(256)) * 100)
    ck = w.commit({}).id
    target = CheckpointStore(tmp_path / "target", chunk_size=4096)
    flaky.down = True
    with pytest.raises(StoreUnreachable) as err:
        replicate(source, target, "job", ck)
    assert err.value.fields["store"] == source.url and "manifest" in err.value.message
    flaky.down = False

    def fall_silent(done: int, total: int) -> None:  # once the manifest is read and the copy begins
        flaky.down = True

    with pytest.raises(StoreUnreachable) as err:
        replicate(source, target, "job", ck, fall_silent)
    assert err.value.fields["store"] == source.url and "chunks/" in err.value.message
    flaky.down = False
    assert target.latest("job") is None
    assert replicate(source, target, "job", ck).copied_chunks > 0  # once it answers again
    source.close()
    target.close()


def test_a_target_that_does_not_answer_is_not_the_sources_silence(flaky: type[FlakyFileSystem],
                                                                    tmp_path: Path) -> None:
    source = CheckpointStore(tmp_path / "source", chunk_size=4096)
    w = source.writer("job")
    w.add_bytes("f", bytes(range(256)) * 100)
    ck = w.commit({}).id
    target = CheckpointStore(f"flaky://dst-{uuid.uuid4().hex}", chunk_size=4096, retry=FAST)
    flaky.down = True
    with pytest.raises(StorageError) as err:
        replicate(source, target, "job", ck)
    assert not isinstance(err.value, StoreUnreachable) and err.value.fields["reason"] == "unavailable"
    flaky.down = False
    source.close()
    target.close()
