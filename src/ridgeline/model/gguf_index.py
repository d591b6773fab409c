"""What a GGUF file's header says (metadata values and where each tensor lies), cached once per file.

gguf's Python reader turns every entry of a 262k-token vocabulary into several numpy views and then back into
Python values: most of a cold start. The result depends only on the file's bytes, so it is kept beside the
kernel cache, one entry per model path, holding the identity it was read from (path, size, modification time,
inode, and the layout of this cache); a warm start reads it back in a fraction of a second and maps the tensors
straight from the file. An entry that is missing, stale, unreadable or corrupt is rebuilt from the file, and the
new one replaces the old atomically.
"""

import hashlib
import mmap
import os
import pickle
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader

from ridgeline.errors import ModelLoadError
from ridgeline.model.gguf_check import check_gguf
from ridgeline.model.mapped_files import register

INDEX_LAYOUT = 1  # bump when GgufIndex or the values it holds change shape: old entries are then never read
MIN_CACHED_FILE_BYTES = 32 * 1024 * 1024  # smaller files (tests' tiny models, in fresh temporary paths) parse fast


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as gguf's reader exposes it: its data is `dtype` items of `data_shape` at `offset` bytes."""

    name: str
    tensor_type: int
    dims: tuple[int, ...]  # as GGUF lists them, innermost first
    offset: int
    dtype: str
    data_shape: tuple[int, ...]


@dataclass(frozen=True)
class GgufIndex:
    identity: str
    fields: dict[str, Any]  # every metadata field's value, vocabulary arrays included
    tensors: tuple[TensorEntry, ...]

    def tensor_data(self, path: Path) -> dict[str, np.ndarray]:
        """Each tensor's data as a read-only view of one memory map of the file (no bytes are read here)."""
        with open(path, "rb") as file:
            mapping = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        file_map = np.frombuffer(mapping, dtype=np.uint8)  # every view below keeps `mapping` (its base) alive
        register(mapping, file_map.ctypes.data, identity=self.identity)  # the pack cache names weights by place
        views = {}
        for entry in self.tensors:
            dtype = np.dtype(entry.dtype)
            count = int(np.prod(entry.data_shape))
            start, end = entry.offset, entry.offset + count * dtype.itemsize
            views[entry.name] = file_map[start:end].view(dtype).reshape(entry.data_shape)
        return views


def file_identity(path: Path) -> str:
    """Changes whenever the file may have: another path, size, modification time or inode."""
    stat = path.stat()
    return f"{INDEX_LAYOUT}|{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ino}"


def cache_path(path: Path) -> Path:
    """One entry per model path: a changed file's new index replaces its old one instead of piling up beside it."""
    from ridgeline.model import native  # here, not above: native imports torch, which a tokenizer never needs

    name = hashlib.sha256(f"{INDEX_LAYOUT}|{path.resolve()}".encode()).hexdigest()[:32]
    return native.CACHE_DIR / "gguf_index" / f"{name}.pickle"


def read_fields(reader: GGUFReader) -> dict[str, Any]:
    """Every metadata field as a Python value; a field type gguf cannot decode is left out (nothing needs it)."""
    fields = {}
    for key, field in reader.fields.items():
        try:
            fields[key] = field.contents()
        except Exception:  # noqa: BLE001 - gguf raises various errors for types it cannot decode
            continue
    return fields


def open_gguf(path: Path) -> GGUFReader:
    check_gguf(path)  # counts, lengths and offsets against the file's size, before the reader trusts them
    try:
        return GGUFReader(path)
    except (ValueError, IndexError, OSError, KeyError, TypeError) as error:
        raise ModelLoadError(f"{path} is not a readable GGUF file (truncated or corrupt?): {error}") from None


def index_from_file(path: Path, identity: str) -> GgufIndex:
    reader = open_gguf(path)
    tensors = tuple(
        TensorEntry(tensor.name, int(tensor.tensor_type), tuple(int(d) for d in tensor.shape), int(tensor.data_offset),
                    tensor.data.dtype.str, tuple(tensor.data.shape))
        for tensor in reader.tensors
    )
    return GgufIndex(identity, read_fields(reader), tensors)


def _read_cached(target: Path, identity: str) -> GgufIndex | None:
    try:
        with open(target, "rb") as file:
            index = pickle.load(file)
    except FileNotFoundError:
        return None
    except Exception as error:  # noqa: BLE001 - any unreadable entry (truncated, garbage, old classes) is rebuilt
        warnings.warn(f"ridgeline: ignoring an unreadable GGUF index cache {target} ({type(error).__name__}); "
                      f"rebuilding it")
        return None
    if not isinstance(index, GgufIndex) or index.identity != identity:
        return None  # the file changed since (or a foreign entry): parse it again
    return index


def _write_atomically(target: Path, index: GgufIndex) -> None:
    """Write beside the target and rename over it: a reader sees the old entry or the whole new one, never half."""
    partial = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=target.name, suffix=".tmp", delete=False) as file:
            partial = Path(file.name)
            pickle.dump(index, file, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, target)
    except OSError as error:  # a read-only or full cache folder costs the next start time, not this one
        warnings.warn(f"ridgeline: could not cache the GGUF index at {target}: {error}")
        if partial is not None:
            partial.unlink(missing_ok=True)


def load_index(path: Path) -> GgufIndex:
    """The file's index from the cache when it is there and current, else parsed from the file and cached."""
    identity = file_identity(path)
    if path.stat().st_size < MIN_CACHED_FILE_BYTES:
        return index_from_file(path, identity)
    target = cache_path(path)
    index = _read_cached(target, identity)
    if index is None:
        index = index_from_file(path, identity)
        _write_atomically(target, index)
    return index
