"""The manifest of a checkpoint: every file, its chunks and their sha256, and the caller's metadata.

A manifest is JSON and carries the sha256 of its own canonical form (``digest``), so a damaged
manifest is detected rather than misread. A checkpoint exists exactly when its manifest does.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tidal.errors import CheckpointCorrupt, ValidationError

FORMAT = 1
MANIFEST = "manifest.json"

_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def check_id(kind: str, value: str) -> str:
    """Job and checkpoint ids become path components: allow only a safe alphabet."""
    if not isinstance(value, str) or not _SAFE_ID.fullmatch(value):
        raise ValidationError(f"invalid {kind} {value!r}: use letters, digits, '.', '_' and '-'",
                              field=kind.replace(" ", "_"), hint="at most 200 characters, the first a letter or digit")
    return value


def check_name(name: str) -> str:
    """A name inside a checkpoint is a relative POSIX path without '.', '..' or empty parts."""
    parts = name.split("/") if isinstance(name, str) else [""]
    if not name or any(p in ("", ".", "..") for p in parts) or "\0" in name:
        raise ValidationError(f"invalid name {name!r} inside a checkpoint: use a relative POSIX path",
                              field="name", hint="no leading '/', no empty, '.' or '..' parts, no NUL")
    return name


def new_checkpoint_id(seq: int) -> str:
    """Sortable and unique: the per-job sequence number, then a random suffix."""
    return f"{seq:06d}-{secrets.token_hex(3)}"


def sequence_of(checkpoint_id: str) -> int:
    head = checkpoint_id.split("-", 1)[0]
    return int(head) if head.isdigit() else -1


def sort_key(checkpoint_id: str) -> tuple[int, str]:
    return (sequence_of(checkpoint_id), checkpoint_id)


@dataclass(frozen=True)
class Entry:
    """One file or symlink of a checkpoint. ``chunks`` lists ``(sha256, length)`` in file order.

    ``sha256`` of a file is :func:`file_digest` of its size and chunk list (a hash tree: every chunk is
    checked against its own sha256, so a file's bytes are hashed once, not twice); of a symlink, the
    sha256 of its target."""

    name: str
    kind: Literal["file", "symlink"]
    size: int
    mode: int
    sha256: str
    chunks: tuple[tuple[str, int], ...] = ()
    target: str | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "size": self.size,
            "mode": self.mode,
            "sha256": self.sha256,
        }
        if self.kind == "symlink":
            d["target"] = self.target
        else:
            d["chunks"] = [[h, n] for h, n in self.chunks]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Entry:
        kind = d["kind"]
        if kind not in ("file", "symlink"):
            raise ValidationError(f"unknown entry kind {kind!r}", field="kind")
        chunks = tuple((str(h), int(n)) for h, n in d.get("chunks", ()))
        if kind == "file" and sum(n for _, n in chunks) != int(d["size"]):
            raise ValidationError(f"chunks of {d['name']!r} do not add up to its size", field="chunks")
        return cls(
            name=str(d["name"]),
            kind=kind,
            size=int(d["size"]),
            mode=int(d["mode"]),
            sha256=str(d["sha256"]),
            chunks=chunks,
            target=d.get("target"),
        )


@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint, as listed by the store."""

    job_id: str
    id: str
    created_at: float
    logical_bytes: int
    stored_bytes: int
    files: int
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)


@dataclass(frozen=True)
class Manifest:
    job_id: str
    id: str
    created_at: float
    chunk_bytes: int  # compressed bytes of the chunks this checkpoint newly wrote
    meta: dict[str, Any]
    entries: tuple[Entry, ...]

    def info(self, manifest_bytes: int) -> CheckpointInfo:
        return CheckpointInfo(
            job_id=self.job_id,
            id=self.id,
            created_at=self.created_at,
            logical_bytes=sum(e.size for e in self.entries if e.kind == "file"),
            stored_bytes=self.chunk_bytes + manifest_bytes,
            files=len(self.entries),
            meta=self.meta,
        )

    def chunk_digests(self) -> set[str]:
        return {h for e in self.entries for h, _ in e.chunks}

    def encode(self) -> bytes:
        body = {
            "format": FORMAT,
            "job_id": self.job_id,
            "id": self.id,
            "created_at": self.created_at,
            "chunk_bytes": self.chunk_bytes,
            "meta": self.meta,
            "entries": [e.to_json() for e in self.entries],
        }
        body["digest"] = _digest(body)
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes, where: str) -> Manifest:
        """Parse and check a manifest; ``where`` names it in the error."""
        try:
            body = json.loads(raw)
            digest = body.pop("digest")
            if digest != _digest(body):
                raise CheckpointCorrupt(
                    f"manifest {where} is corrupt: sha256 mismatch", object=where, reason="sha256 mismatch"
                )
            if body.get("format") != FORMAT:
                raise ValidationError(f"unsupported format {body.get('format')!r}", field="format")
            return cls(
                job_id=str(body["job_id"]),
                id=str(body["id"]),
                created_at=float(body["created_at"]),
                chunk_bytes=int(body["chunk_bytes"]),
                meta=dict(body["meta"]),
                entries=tuple(Entry.from_json(e) for e in body["entries"]),
            )
        except CheckpointCorrupt:
            raise
        except (ValidationError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise CheckpointCorrupt(
                f"manifest {where} is undecodable ({e})", object=where, reason="undecodable"
            ) from None


def normalise_meta(meta: dict[str, Any]) -> dict[str, Any]:
    """Round-trip through JSON so the stored digest matches what a reader re-encodes."""
    try:
        out = json.loads(json.dumps(meta, sort_keys=True))
    except (TypeError, ValueError) as e:
        raise ValidationError(f"checkpoint meta must be JSON-able: {e}", field="meta",
                              hint="strings, numbers, booleans, None, lists and dicts with string keys") from None
    if not isinstance(out, dict):
        raise ValidationError("checkpoint meta must be a dict", field="meta")
    return out


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_digest(size: int, chunks: Sequence[tuple[str, int]]) -> str:
    """The sha256 that names a file: over its size and the digests and lengths of its chunks."""
    h = hashlib.sha256(size.to_bytes(8, "little"))
    for digest, n in chunks:
        h.update(bytes.fromhex(digest))
        h.update(n.to_bytes(8, "little"))
    return h.hexdigest()
