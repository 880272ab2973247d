"""The checkpoint store on S3 or an S3-compatible server (``s3://bucket/prefix``), through fsspec's s3fs.

s3fs supplies the session (credentials the usual AWS way: the arguments here, ``AWS_ACCESS_KEY_ID`` /
``AWS_SECRET_ACCESS_KEY`` / ``AWS_ENDPOINT_URL``, a profile, an instance role), the event loop and the
connection pool; the requests themselves are made here, so that every one of them is

* **retried** when it fails on the way or the server answers 5xx/408/429 (:mod:`.retry`; botocore's and
  s3fs's own retries are turned off, so that the bound is this one);
* **checked**: every PUT and every part of a multipart upload carries its ``Content-MD5``, which the server
  verifies before it stores anything (``BadDigest`` otherwise), and the ETag it answers is compared with
  the MD5 sent (for a multipart object, the MD5 of the parts' MD5s and the part count) wherever the ETag is
  an MD5 (not under SSE-KMS or SSE-C);
* **read back** where it matters: a durable put (the manifest, which commits a checkpoint) is read back and
  compared with what was written before the commit returns;
* **private**: no ACL is ever sent, so objects get the bucket's default (owner only); ``sse`` asks for
  server-side encryption on every PUT.

An object of ``multipart_threshold`` bytes or more is uploaded in parts of ``part_size``, up to
``part_concurrency`` at a time; a failed multipart upload is aborted. A single PUT or the completion of a
multipart upload is atomic on S3: readers see the whole object or none, which is what the store's commit
(one PUT of the manifest, after every chunk) relies on.

Listings are of objects, not of "directories": a name is listed only while some object lies under it
(SeaweedFS, unlike AWS, keeps empty prefixes after their objects are deleted).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from tidal.errors import ConfigError, StorageError

from .retry import RetryPolicy, answer, retrying

T = TypeVar("T")

MiB = 1 << 20
#: S3's smallest part (but the last) and most parts of one multipart upload.
MIN_PART = 5 * MiB
MAX_PARTS = 10_000

AddressingStyle = Literal["auto", "path", "virtual"]

_HINT = ("check that the checkpoint store is up and reachable from this node (endpoint URL, network, TLS), "
         "then try again; an interrupted checkpoint is never committed, the last committed one stays")


def _md5(data: bytes | memoryview) -> hashlib._Hash:
    return hashlib.md5(data, usedforsecurity=False)


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


class S3Backend:
    """Objects under ``s3://bucket/prefix``; see the module's docstring."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        key: str | None = None,
        secret: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        addressing_style: AddressingStyle | None = None,
        retry: RetryPolicy | int | None = None,
        timeout: float = 30.0,
        part_size: int = 8 * MiB,
        multipart_threshold: int | None = None,
        part_concurrency: int = 4,
        sse: str | None = None,
        sse_kms_key_id: str | None = None,
        max_connections: int = 64,
        gc_grace: float = 60.0,
        **fs_options: Any,
    ) -> None:
        try:
            import s3fs
        except ImportError:
            raise ConfigError(f"the checkpoint store {url} is on S3, but s3fs is not installed",
                              hint="install Tidal with its S3 support: pip install 'tidal[s3]'") from None
        scheme, _, rest = url.partition("://")
        bucket, _, prefix = rest.partition("/")
        if scheme not in ("s3", "s3a") or not bucket:
            raise ConfigError(f"not an S3 URL: {url!r}", hint="give it as s3://BUCKET/PREFIX")
        if part_size < MIN_PART:
            raise ConfigError(f"part_size {part_size} is below S3's minimum part of {MIN_PART} bytes",
                              hint="use at least 5 MiB")
        self.url = url.rstrip("/")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if isinstance(retry, int):
            retry = RetryPolicy(attempts=max(1, retry))
        self.retry = retry or RetryPolicy()
        self.part_size = part_size
        self.multipart_threshold = multipart_threshold or 2 * part_size
        self.part_concurrency = max(1, part_concurrency)
        #: Seconds garbage collection spares a chunk beyond the oldest writer's start (:mod:`.sweep`): the
        #: skew between the clocks of the hosts and the store's, and the store's whole-second timestamps.
        self.gc_grace = gc_grace
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        style = addressing_style or ("path" if endpoint else "auto")
        config: dict[str, Any] = {
            "s3": {"addressing_style": style},
            # One try per request down there: the retries are this backend's, bounded by self.retry.
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            "connect_timeout": timeout,
            "read_timeout": timeout,
            "max_pool_connections": max_connections,
            # Integrity is Content-MD5 (checked by the server) and the ETag (checked here), which every
            # S3-compatible server supports; the newer trailing checksums are not sent unless required.
            "request_checksum_calculation": "when_required",
            "response_checksum_validation": "when_required",
        }
        client_kwargs = dict(fs_options.pop("client_kwargs", {}))
        if region:
            client_kwargs["region_name"] = region
        session = {"profile": profile} if profile else {}
        self.fs = s3fs.S3FileSystem(
            endpoint_url=endpoint_url, key=key, secret=secret, client_kwargs=client_kwargs,
            config_kwargs={**config, **fs_options.pop("config_kwargs", {})},
            use_listings_cache=False,  # other nodes write too: never answer from a stale listing
            skip_instance_cache=True, max_concurrency=1, **session, **fs_options,
        )
        self.fs.retries = 1  # s3fs's own retry loop: one try
        self._put_extra: dict[str, str] = {}
        if sse:
            self._put_extra["ServerSideEncryption"] = sse
        if sse_kms_key_id:
            self._put_extra["SSEKMSKeyId"] = sse_kms_key_id
        self._parts: ThreadPoolExecutor | None = None
        self._parts_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"S3Backend({self.url!r})"

    # --- requests ----------------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._key(key)}"

    def _call(self, what: str, key: str, method: str, **kwargs: Any) -> Any:
        def once() -> Any:
            return self.fs.call_s3(method, Bucket=self.bucket, **kwargs)

        return self._retrying(once, what, key)

    def _retrying(self, fn: Callable[[], T], what: str, key: str) -> T:
        """``fn()`` with retries. No such object: ``FileNotFoundError``; any other failure comes out as a
        StorageError with the original as its cause."""
        try:
            return retrying(fn, self.retry, what, self._where(key), hint=_HINT)
        except StorageError:
            raise
        except FileNotFoundError as e:
            if answer(e)[1] == "NoSuchBucket":  # not a missing object: a store that is not there
                raise self._fail(e, what, key) from e
            raise
        except Exception as e:
            raise self._fail(e, what, key) from e

    def _fail(self, e: BaseException, what: str, key: str) -> StorageError:
        status, code = answer(e)
        where = self._where(key)
        if code == "NoSuchBucket":
            return StorageError(f"checkpoint store error {what} {where}: bucket {self.bucket} does not exist",
                                object=where, reason="no such bucket",
                                hint="create the bucket (see docs/store.md) or correct TIDAL_CHECKPOINT_STORE")
        if isinstance(e, PermissionError) or status == 403:
            return StorageError(
                f"checkpoint store refused {what} {where}: {code or 'access denied'}: {e}", object=where,
                reason="access denied",
                hint="check the store's credentials (TIDAL_STORE_ACCESS_KEY_ID, an AWS profile or role) and that "
                     "the bucket policy lets them get, put, list and delete objects under the store's prefix")
        return StorageError(f"checkpoint store error {what} {where}: {code or type(e).__name__}: {e}",
                            object=where, reason=str(code or type(e).__name__), hint=_HINT)

    def _run(self, coro_fn: Callable[[], Any]) -> Any:
        """Run an s3fs coroutine on its loop (requests whose answer is read asynchronously)."""
        from fsspec.asyn import sync

        return sync(self.fs.loop, coro_fn)

    # --- reading -----------------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        try:
            self._call("checking", key, "head_object", Key=self._key(key))
            return True
        except FileNotFoundError:
            return False

    def modified(self, key: str) -> float | None:
        try:
            r = self._call("checking", key, "head_object", Key=self._key(key))
        except FileNotFoundError:
            return None
        when = r.get("LastModified")
        return float(when.timestamp()) if when is not None else 0.0

    def get(self, key: str) -> bytes:
        async def fetch() -> bytes:
            r = await self.fs._call_s3("get_object", Bucket=self.bucket, Key=self._key(key))
            try:
                data: bytes = await r["Body"].read()  # a body cut short raises (aiohttp's payload error)
            finally:
                r["Body"].close()
            return data

        data: bytes = self._retrying(lambda: self._run(fetch), "reading", key)
        return data

    def get_into(self, key: str, buf: bytearray) -> bytes | memoryview:
        return self.get(key)

    def listdir(self, key: str) -> list[str]:
        base = self._key(key).strip("/")
        prefix = f"{base}/" if base else ""
        names: dict[str, None] = {}
        for k, _ in self._objects(prefix, key):
            first = k[len(prefix):].split("/", 1)[0]
            if first:
                names[first] = None
        return list(names)

    def _objects(self, prefix: str, key: str) -> Iterator[tuple[str, float]]:
        """(key, last modified, seconds since the epoch) of every object whose key starts with ``prefix``."""
        token: str | None = None
        while True:
            page = self._call("listing", key, "list_objects_v2", Prefix=prefix, MaxKeys=1000,
                              **({"ContinuationToken": token} if token else {}))
            for obj in page.get("Contents", ()):
                modified = obj.get("LastModified")
                yield obj["Key"], modified.timestamp() if modified is not None else 0.0
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def chunks(self) -> Iterator[tuple[str, float | None]]:
        # One listing of every chunk, with the time each was written: garbage collection spares young ones.
        strip = len(self.prefix) + 1 if self.prefix else 0
        for k, modified in self._objects(f"{self._key('chunks')}/", "chunks"):
            yield k[strip:], modified

    # --- writing -----------------------------------------------------------------------------------

    def put_chunk(self, key: str, tag: bytes, payload: bytes | memoryview) -> int:
        data = tag + bytes(payload)
        self._put(key, data)
        return len(data)

    def put(self, key: str, data: bytes, *, durable: bool = True) -> None:
        """``durable`` (a manifest: the commit) also reads the object back and compares it with ``data``, so
        that a commit returns only once any reader would find the very bytes written."""
        data = bytes(data)
        self._put(key, data)
        if durable and self.get(key) != data:
            where = self._where(key)
            raise StorageError(f"checkpoint store returned other bytes for {where} than were just written",
                               object=where, reason="read-back mismatch",
                               hint="the server did not keep what it acknowledged; nothing was committed")

    def _put(self, key: str, data: bytes) -> None:
        try:
            self._put_object(key, data)
        except FileNotFoundError as e:  # an upload aborted under us (NoSuchUpload): a failed write, not a read
            raise self._fail(e, "writing", key) from e

    def _put_object(self, key: str, data: bytes) -> None:
        if len(data) >= self.multipart_threshold:
            self._put_multipart(key, data)
            return
        md5 = _md5(data)
        r = self._call("writing", key, "put_object", Key=self._key(key), Body=data, ContentMD5=_b64(md5.digest()),
                       **self._put_extra)
        self._check_etag(r, md5.hexdigest(), key)

    def _check_etag(self, r: dict[str, Any], want: str, key: str, what: str = "object") -> None:
        """The ETag S3 answered is the MD5 of what it stored, except under SSE-KMS or SSE-C (the server has
        then checked the Content-MD5 sent, and that is the check)."""
        if str(r.get("ServerSideEncryption", "")).startswith("aws:kms") or r.get("SSECustomerAlgorithm"):
            return
        got = str(r.get("ETag", "")).strip('"')
        if got != want:
            where = self._where(key)
            raise StorageError(
                f"checkpoint store stored {what} {where} with ETag {got or 'none'}, not the MD5 {want} of what "
                "was sent", object=where, reason="checksum mismatch",
                hint="the server or something between it and this node altered the data; nothing was committed")

    def _pool(self) -> ThreadPoolExecutor:
        with self._parts_lock:
            if self._parts is None:
                self._parts = ThreadPoolExecutor(self.part_concurrency, thread_name_prefix="tidal-s3-part")
            return self._parts

    def _put_multipart(self, key: str, data: bytes) -> None:
        part = max(self.part_size, -(-len(data) // MAX_PARTS))
        view = memoryview(data)
        ranges = [(i + 1, off, min(part, len(data) - off)) for i, off in enumerate(range(0, len(data), part))]
        name = self._key(key)
        upload = self._call("starting an upload of", key, "create_multipart_upload", Key=name,
                            **self._put_extra)["UploadId"]
        md5s: dict[int, bytes] = {}

        def send(number: int, off: int, n: int) -> dict[str, Any]:
            body = bytes(view[off : off + n])
            md5 = _md5(body)
            r = self._call(f"writing part {number} of", key, "upload_part", Key=name, UploadId=upload,
                           PartNumber=number, Body=body, ContentMD5=_b64(md5.digest()))
            self._check_etag(r, md5.hexdigest(), key, f"part {number} of")
            md5s[number] = md5.digest()
            return {"PartNumber": number, "ETag": r["ETag"]}

        try:
            parts = list(self._pool().map(lambda r: send(*r), ranges))
            want = f"{_md5(b''.join(md5s[n] for n, _, _ in ranges)).hexdigest()}-{len(ranges)}"
            tries = 0

            def complete() -> dict[str, Any]:
                nonlocal tries
                tries += 1
                try:
                    r: dict[str, Any] = self.fs.call_s3("complete_multipart_upload", Bucket=self.bucket, Key=name,
                                                        UploadId=upload, MultipartUpload={"Parts": parts})
                    return r
                except FileNotFoundError:
                    if tries == 1:
                        raise
                    # An earlier try completed it but its answer was lost: the object is there.
                    head: dict[str, Any] = self.fs.call_s3("head_object", Bucket=self.bucket, Key=name)
                    return head

            r = self._retrying(complete, "completing the upload of", key)
            self._check_etag(r, want, key)
        except BaseException:
            with contextlib.suppress(Exception):
                self.fs.call_s3("abort_multipart_upload", Bucket=self.bucket, Key=name, UploadId=upload)
            raise

    def make_durable(self, keys: Sequence[str], pool: Executor) -> None:
        return None  # S3 answers a PUT once the object is durable

    def mkdir(self, key: str) -> bool:
        return True  # no directories: a prefix exists while an object lies under it

    # --- deleting ----------------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        self._call("deleting", key, "delete_object", Key=self._key(key))

    def delete_tree(self, key: str) -> None:
        base = self._key(key).strip("/")
        keys = [k for k, _ in self._objects(f"{base}/" if base else "", key)]
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            r = self._call("deleting", key, "delete_objects",
                           Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
            errors = [e for e in r.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                where = f"s3://{self.bucket}/{first.get('Key')}"
                raise StorageError(f"checkpoint store error deleting {where}: {first.get('Code')}: "
                                   f"{first.get('Message')} ({len(errors)} objects not deleted)",
                                   object=where, reason=str(first.get("Code")), hint=_HINT)

    def close(self) -> None:
        with self._parts_lock:
            if self._parts is not None:
                self._parts.shutdown(wait=True)
                self._parts = None
