"""The checkpoint store on a real S3 server (SeaweedFS on loopback): multipart objects, retries through real
faults (reset connections, 503 answers, corrupted uploads, the server stopped and started), garbage
collection's grace, private objects, credentials from the settings and from AWS's environment."""

from __future__ import annotations

import hashlib
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.relay import Relay
from tidal.config import Settings
from tidal.errors import StorageError
from tidal.mechanisms.storage import CheckpointStore, open_store
from tidal.mechanisms.storage.chunks import chunk_key
from tidal.mechanisms.storage.retry import RetryPolicy
from tidal.mechanisms.storage.s3 import MiB, S3Backend
from tidal.testing.seaweedfs import SeaweedFS

pytestmark = pytest.mark.s3

CHUNK = 256 * 1024


def rand(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def s3(store: CheckpointStore) -> S3Backend:
    assert isinstance(store.backend, S3Backend)
    return store.backend


@pytest.fixture
def relay(seaweedfs: SeaweedFS) -> Iterator[Relay]:
    r = Relay((seaweedfs.addr, seaweedfs.ports["s3"]))
    yield r
    r.close()


def through(relay: Relay, seaweedfs: SeaweedFS, url: str, **kw: Any) -> CheckpointStore:
    """A store that reaches SeaweedFS through the relay."""
    opts = {**seaweedfs.store_options(), "endpoint_url": relay.url, "gc_grace": 0, **kw}
    return CheckpointStore(url, chunk_size=CHUNK, **opts)


def test_multipart_object_round_trips(seaweedfs: SeaweedFS, s3_url: str, tmp_path: Any) -> None:
    # 12 MiB chunks of random bytes (stored raw, 12 MiB + the tag byte) go up in three parts of 5 MiB.
    store = CheckpointStore(s3_url, chunk_size=12 * MiB, part_size=5 * MiB, multipart_threshold=10 * MiB,
                            gc_grace=0, **seaweedfs.store_options())
    data = rand(24 * MiB + 12345, 1)
    (tmp_path / "pages.img").write_bytes(data)
    w = store.writer("job")
    e = w.add_file("pages.img", tmp_path / "pages.img")
    info = w.commit({})
    assert [n for _, n in e.chunks] == [12 * MiB, 12 * MiB, 12345]
    b = s3(store)
    heads = [b.fs.call_s3("head_object", Bucket=b.bucket, Key=b._key(chunk_key(h))) for h, _ in e.chunks]
    assert [h["ETag"].strip('"').rsplit("-", 1)[-1] for h in heads[:2]] == ["3", "3"]  # multipart: 3 parts
    assert [h["ContentLength"] for h in heads] == [12 * MiB + 1, 12 * MiB + 1, 12346]
    store.verify("job", info.id)
    store.reader("job", info.id).extract("pages.img", tmp_path / "out.img")
    assert hashlib.sha256((tmp_path / "out.img").read_bytes()).digest() == hashlib.sha256(data).digest()
    # No upload is left behind half-done.
    uploads = b.fs.call_s3("list_multipart_uploads", Bucket=b.bucket, Prefix=b.prefix)
    assert uploads.get("Uploads", []) == []
    store.backend.delete_tree("")
    store.close()


def test_reset_connections_are_retried(seaweedfs: SeaweedFS, s3_url: str, relay: Relay) -> None:
    store = through(relay, seaweedfs, s3_url)
    data = rand(8 * CHUNK, 2)
    w = store.writer("job")
    relay.cut()  # the connections the client holds are reset, and the next three new ones too
    relay.reset_next(3)
    w.add_bytes("f", data)
    info = w.commit({})
    assert relay.counts["reset"] == 3
    relay.cut()
    relay.reset_next(3)
    assert store.reader("job", info.id).read_bytes("f") == data
    assert relay.counts["reset"] == 6
    store.close()


def test_server_errors_are_retried(seaweedfs: SeaweedFS, s3_url: str, relay: Relay) -> None:
    store = through(relay, seaweedfs, s3_url)
    w = store.writer("job")
    w.add_bytes("f", b"kept")
    info = w.commit({})
    relay.cut()
    relay.reject_next(3)  # 503 ServiceUnavailable, three times
    assert store.reader("job", info.id).read_bytes("f") == b"kept"
    assert relay.counts["rejected"] == 3
    store.close()


def test_a_store_that_stays_down_fails_with_a_storage_error(seaweedfs: SeaweedFS, s3_url: str,
                                                            relay: Relay) -> None:
    store = through(relay, seaweedfs, s3_url, retry=RetryPolicy(attempts=3, base=0.05, cap=0.1))
    w = store.writer("job")
    w.add_bytes("f", b"first")
    good = w.commit({})
    w = store.writer("job")
    relay.cut()
    relay.reject_next(1000)
    t = time.monotonic()
    with pytest.raises(StorageError) as err:
        w.add_bytes("g", rand(CHUNK, 3))
    assert time.monotonic() - t < 10
    e = err.value
    assert e.fields["reason"] == "unavailable" and e.fields["attempts"] == 3
    assert "ServiceUnavailable" in e.message and "tried 3 times" in e.message and s3_url in e.message
    assert "reachable" in (e.hint or "")
    relay.clear()
    store = through(relay, seaweedfs, s3_url)
    assert store.list("job") == [good]
    assert store.reader("job", good.id).read_bytes("f") == b"first"
    store.close()


def test_corrupted_uploads_never_land(seaweedfs: SeaweedFS, s3_url: str, relay: Relay) -> None:
    store = through(relay, seaweedfs, s3_url, retry=RetryPolicy(attempts=3, base=0.05, cap=0.1))
    b = s3(store)
    data = rand(3 * MiB, 4)
    relay.corrupt_next(3)  # every try has one byte of its body flipped on the way
    with pytest.raises(StorageError) as err:
        b.put("obj", data)
    assert relay.counts["corrupted"] == 3
    assert "BadDigest" in err.value.message or "SHA256Mismatch" in err.value.message
    assert not b.exists("obj")
    relay.corrupt_next(1)  # once: the retry lands the right bytes
    b.put("obj", data)
    assert relay.counts["corrupted"] == 4
    assert b.get("obj") == data
    # A multipart upload: one corrupted part is sent again; the object is whole.
    b.part_size, b.multipart_threshold = 5 * MiB, 10 * MiB
    big = rand(12 * MiB, 5)
    relay.corrupt_next(1)
    b.put("big", big)
    assert relay.counts["corrupted"] == 5
    assert b.get("big") == big
    store.close()


def test_server_stopped_and_started_during_an_upload_is_ridden_out(tmp_path: Any) -> None:
    server = SeaweedFS()
    try:
        store = CheckpointStore(f"s3://{server.bucket}/t", chunk_size=CHUNK, gc_grace=0,
                                retry=RetryPolicy(attempts=12, base=0.25, cap=4.0), **server.store_options())
        b = s3(store)
        put_chunk = b.put_chunk
        puts = []
        outage = threading.Thread(target=lambda: (server.shutdown(), time.sleep(1.0), server.start()))

        def stop_after_first(key: str, tag: bytes, payload: bytes | memoryview) -> int:
            puts.append(key)
            if len(puts) == 2:
                outage.start()
                time.sleep(0.5)
            return put_chunk(key, tag, payload)

        b.put_chunk = stop_after_first  # type: ignore[method-assign]
        data = rand(16 * CHUNK, 5)
        w = store.writer("job")
        w.add_bytes("f", data)
        info = w.commit({})
        outage.join()
        assert len(puts) == 16
        assert store.reader("job", info.id).read_bytes("f") == data
        store.close()
    finally:
        server.stop()


def test_a_reader_never_sees_a_checkpoint_before_its_commit(seaweedfs: SeaweedFS, s3_url: str) -> None:
    store = CheckpointStore(s3_url, chunk_size=CHUNK, gc_grace=0, **seaweedfs.store_options())
    other = CheckpointStore(s3_url, chunk_size=CHUNK, **seaweedfs.store_options())  # another client, as another node
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for info in other.list("job"):
                other.verify("job", info.id)  # whatever is listed is whole
                seen.append(info.id)

    t = threading.Thread(target=watch)
    t.start()
    try:
        w = store.writer("job")
        for i in range(6):
            w.add_bytes(f"f{i}", rand(4 * CHUNK, 10 + i))
        assert seen == []
        info = w.commit({})
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        t.join()
    assert set(seen) == {info.id}
    store.close()
    other.close()


def test_a_periodic_checkpoint_asks_only_about_chunks_the_last_one_lacks(seaweedfs: SeaweedFS, s3_url: str,
                                                                          tmp_path: Any) -> None:
    store = CheckpointStore(s3_url, chunk_size=CHUNK, gc_grace=0, **seaweedfs.store_options())
    data = rand(16 * CHUNK, 7)
    img = tmp_path / "pages.img"
    img.write_bytes(data)
    w = store.writer("job")
    w.add_file("pages.img", img)
    first = w.commit({})
    asked: list[str] = []
    exists = store.backend.exists

    def counting(key: str) -> bool:
        asked.append(key)
        return exists(key)

    store.backend.exists = counting  # type: ignore[method-assign]
    img.write_bytes(data[: 15 * CHUNK] + rand(CHUNK, 8))
    w = store.writer("job")
    w.add_file("pages.img", img)
    assert len(asked) == 1  # a HEAD for the changed chunk only
    assert store.retain("job", 0) == [first.id]  # the first goes while the second is written ...
    second = w.commit({})
    # A collection overlapped the writer: before its commit it checked the 15 chunks it took from the first
    # (its pending refs had kept them: none was put again).
    assert len(asked) == 1 + 15
    assert second.stored_bytes < CHUNK + 8192
    store.verify("job", second.id)  # ... and the chunks the second took from it are all there
    assert store.reader("job", second.id).read_bytes("pages.img") == img.read_bytes()
    store.backend.delete_tree("")
    store.close()


def test_gc_spares_young_chunks(seaweedfs: SeaweedFS, s3_url: str) -> None:
    store = CheckpointStore(s3_url, chunk_size=CHUNK, gc_grace=5, **seaweedfs.store_options())
    default = CheckpointStore(s3_url, **seaweedfs.store_options())
    assert default.gc_grace == 60  # the default on S3
    default.close()
    w = store.writer("job")
    w.add_bytes("f", rand(2 * CHUNK, 6))
    w.commit({})
    store.retain("job", 0)
    assert store.list("job") == []
    chunks = list(store.backend.chunks())
    assert len(chunks) == 2  # unreferenced, but young: another node may rely on them
    written = max(m for _, m in chunks if m is not None)
    time.sleep(max(0.0, written + 5.5 - time.time()))
    assert store.gc() == 2
    assert list(store.backend.chunks()) == []
    store.close()


def test_objects_are_not_public(seaweedfs: SeaweedFS, s3_url: str) -> None:
    store = CheckpointStore(s3_url, chunk_size=CHUNK, **seaweedfs.store_options())
    w = store.writer("job")
    w.add_bytes("f", b"process memory")
    info = w.commit({})
    b = s3(store)
    manifest = f"{seaweedfs.endpoint_url}/{b.bucket}/{b._key(f'jobs/job/{info.id}/manifest.json')}"
    listing = f"{seaweedfs.endpoint_url}/{b.bucket}?list-type=2&prefix={b.prefix}/"
    for url in (manifest, listing):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=10)  # no credentials
        assert err.value.code == 403
    store.backend.delete_tree("")
    store.close()


def test_wrong_credentials_and_missing_bucket_fail_at_once(seaweedfs: SeaweedFS, s3_url: str) -> None:
    t = time.monotonic()
    wrong = CheckpointStore(s3_url, **{**seaweedfs.store_options(), "secret": "wrong"})
    with pytest.raises(StorageError) as err:
        wrong.writer("job")
    assert err.value.fields["reason"] == "access denied" and "credentials" in (err.value.hint or "")
    wrong.close()
    missing = CheckpointStore(s3_url.replace(f"s3://{seaweedfs.bucket}/", "s3://no-such-bucket/"),
                              **seaweedfs.store_options())
    with pytest.raises(StorageError, match="bucket no-such-bucket does not exist"):
        w = missing.writer("job")
        w.add_bytes("f", b"x")
    missing.close()
    assert time.monotonic() - t < 5  # neither is retried


def test_settings_and_the_aws_environment(seaweedfs: SeaweedFS, s3_url: str,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    settings = Settings(checkpoint_store=f"{s3_url}/tidal", **{  # type: ignore[arg-type]
        "store_endpoint_url": seaweedfs.endpoint_url, "store_access_key_id": seaweedfs.access_key,
        "store_secret_access_key": seaweedfs.secret_key, "store_retries": 2, "store_timeout": 5})
    store = open_store(settings)
    assert s3(store).retry.attempts == 2 and store.workers == 16
    w = store.writer("job")
    w.add_bytes("f", b"from the settings")
    info = w.commit({})
    for k, v in seaweedfs.store_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("TIDAL_CHECKPOINT_STORE", f"{s3_url}/tidal")
    env = open_store()
    assert env.reader("job", info.id).read_bytes("f") == b"from the settings"
    env.close()
    # AWS's own variables, no Tidal setting: the path-style addressing follows from the endpoint.
    for k in seaweedfs.store_env():
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweedfs.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweedfs.secret_key)
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweedfs.endpoint_url)
    aws = CheckpointStore(f"{s3_url}/tidal")
    assert aws.reader("job", info.id).read_bytes("f") == b"from the settings"
    aws.backend.delete_tree("")
    aws.close()
    store.close()
