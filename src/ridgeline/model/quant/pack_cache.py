"""Packed weights kept on disk, so that a second start of the same model skips repacking (~3 s of the default
model's start on 2 cores), and where the compiled kernels do not run, the float32 copies the layers compute with
(gguf's dequantiser: ~10 s; ~1.1 GB on disk for the default model).

An entry is named by what it was packed from: type, shape, the layout the packer writes, and the stored bytes —
by their place in the model file when they are mapped straight from one (the file's identity and offset, read for
nothing: model/mapped_files.py), else by a hash of the bytes themselves. Any change to the weights (another file, a requantised LM head) or to the packer gives another name, so
a stale entry is never read. Small weights (tests' tiny models) are packed afresh: they cost nothing and would
only fill the folder. An unreadable entry is ignored and rewritten; entries are written atomically. Both kinds
are mapped, not read, on a warm start: the pages come in when a step first reads them, as llama.cpp maps its
weights.
"""

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from ridgeline.model import native
from ridgeline.model.mapped_files import locate
from ridgeline.model.quant.packing import QUANT_BITS, PackedWeight, pack
from ridgeline.model.weights import StoredTensor

PACK_LAYOUT = 1  # bump with any change to what pack() writes
# An entry file: MAGIC, the JSON header's length (8 bytes, little-endian), the header (each plane's name, dtype,
# shape and offset), then the planes at 64-byte aligned offsets, so a warm start maps them instead of reading them.
MAGIC = b"ridgeline-packed-1\n"
ALIGN = 64
MIN_CACHED_BYTES = 256 * 1024  # every matrix of a real model is larger; tests' tiny ones are smaller
_PLANES = ("quants", "high", "d", "dmin", "sc", "m")


def entry_path(weight: StoredTensor, kind: str = "packed") -> Path:
    digest = hashlib.sha256(f"{PACK_LAYOUT}|{weight.qtype.name}|{weight.shape}|".encode())
    parts = weight.byte_parts()
    places = [locate(part) for part in parts]
    if all(places):
        # Mapped straight from model files: named by the files' identities and the bytes' places, without reading
        # them (mapped_files.py: hashing read the whole model and kept its pages resident beside the packed copy).
        digest.update(b"places|" + "|".join(f"{p.identity}@{p.offset}+{p.nbytes}" for p in places).encode())
    else:
        digest.update(b"bytes|")
        for part in parts:  # in order: the digest of their concatenation, without making it
            digest.update(memoryview(part.contiguous().numpy()).cast("B"))
    return native.CACHE_DIR / kind / f"{digest.hexdigest()[:40]}.{'pack' if kind == 'packed' else 'npy'}"


def cached_pack(weight: StoredTensor) -> PackedWeight:
    """pack(weight), from the cache when this machine packed the same weight before."""
    if weight.qtype not in QUANT_BITS or weight.nbytes < MIN_CACHED_BYTES:
        return pack(weight)  # (which refuses what it cannot pack)
    path = entry_path(weight)
    packed = _read(path, weight)
    if packed is None:
        packed = pack(weight)
        _write(path, lambda file: _save_planes(file, [plane.numpy() for plane in packed.planes]))
    return packed


def cached_dense(weight: StoredTensor) -> torch.Tensor:
    """weight.dequantize(float32) (the layers' copy where the compiled kernels do not run), from the cache when
    this machine dequantised the same weight before: gguf's dequantiser takes seconds for a whole model."""
    if weight.nbytes < MIN_CACHED_BYTES:
        return weight.dequantize(torch.float32)
    path = entry_path(weight, "dense")
    try:
        # Mapped, not read: a warm start is ready at once and the pages come in on the first request that reads
        # them (as llama.cpp maps its weights). The layers never write to it.
        mapped = np.load(path, allow_pickle=False, mmap_mode="r")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch's note that the array is read-only
            return torch.from_numpy(mapped)
    except FileNotFoundError:
        pass
    except Exception as error:  # noqa: BLE001 - truncated or garbage: dequantise again and overwrite
        warnings.warn(f"ridgeline: ignoring an unreadable dense-weight cache entry {path} ({type(error).__name__})")
    dense = weight.dequantize(torch.float32)
    _write(path, lambda file: np.save(file, dense.numpy()))
    return dense


def _save_planes(file, planes: list[np.ndarray]) -> None:
    entries, offset = [], 0
    for name, plane in zip(_PLANES, planes):
        entries.append([name, plane.dtype.str, list(plane.shape), offset])
        offset += -(-plane.nbytes // ALIGN) * ALIGN
    header = json.dumps(entries).encode()
    start = -(-(len(MAGIC) + 8 + len(header)) // ALIGN) * ALIGN
    file.write(MAGIC + len(header).to_bytes(8, "little") + header)
    file.write(b"\0" * (start - file.tell()))
    for plane in planes:
        file.write(np.ascontiguousarray(plane).tobytes())
        file.write(b"\0" * (-plane.nbytes % ALIGN))


def _map_planes(path: Path) -> list[torch.Tensor]:
    """The planes of an entry, mapped read-only (the layers never write their weights): a warm start costs page
    mappings, not a read and copy of every weight."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    if bytes(data[:len(MAGIC)]) != MAGIC:
        raise ValueError("not a packed-weight entry")
    length = int.from_bytes(bytes(data[len(MAGIC):len(MAGIC) + 8]), "little")
    header_end = len(MAGIC) + 8 + length
    entries = json.loads(bytes(data[len(MAGIC) + 8:header_end]))
    start = -(-header_end // ALIGN) * ALIGN
    planes = []
    for (name, dtype, shape, offset), expected in zip(entries, _PLANES, strict=True):
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if name != expected or start + offset + nbytes > len(data):
            raise ValueError(f"plane {name} does not fit the entry")
        planes.append(data[start + offset:start + offset + nbytes].view(np.dtype(dtype)).reshape(shape))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch's note that the arrays are read-only
        return [torch.from_numpy(plane) for plane in planes]


def _read(path: Path, weight: StoredTensor) -> PackedWeight | None:
    try:
        planes = _map_planes(path)
    except FileNotFoundError:
        return None
    except Exception as error:  # noqa: BLE001 - truncated, garbage or foreign: pack again and overwrite
        warnings.warn(f"ridgeline: ignoring an unreadable packed-weight cache entry {path} ({type(error).__name__})")
        return None
    return PackedWeight(weight.qtype, weight.shape[0], weight.shape[1], *planes)


def _write(path: Path, save) -> None:
    """save(file) into a temporary file beside `path`, renamed over it."""
    partial = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as file:
            partial = Path(file.name)
            save(file)
        os.replace(partial, path)  # readers see no entry or a whole one
    except OSError as error:  # a full or read-only cache costs the next start time, not this one
        warnings.warn(f"ridgeline: could not cache weights at {path}: {error}")
        if partial is not None:
            partial.unlink(missing_ok=True)
