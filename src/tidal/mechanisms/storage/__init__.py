"""The checkpoint store: content-addressed, zstd-compressed, sha256-verified, atomically committed.

A local directory by default; S3 or an S3-compatible server (``s3://bucket/prefix``, :mod:`.s3`), or any
other fsspec URL (``gs://``, ``az://``, ``memory://``) through the same interface. See
:class:`CheckpointStore`; :func:`open_store` opens the one the settings name.
"""

from tidal.mechanisms.storage.manifest import CheckpointInfo, Entry
from tidal.mechanisms.storage.reader import CheckpointReader
from tidal.mechanisms.storage.store import DEFAULT_CHUNK_SIZE, CheckpointStore, open_store, store_options
from tidal.mechanisms.storage.writer import CheckpointWriter

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "CheckpointInfo",
    "CheckpointReader",
    "CheckpointStore",
    "CheckpointWriter",
    "Entry",
    "open_store",
    "store_options",
]
