"""A pass over a GGUF file's header before gguf's GGUFReader sees it, so that a hostile or broken file ends in
one ModelLoadError instead of a hang, a multi-GB allocation or a stray exception.

GGUFReader trusts the counts it reads: an array claiming 2**60 elements past the end of the file makes it
loop forever appending empty views, and every array element costs it a Python object (~100 bytes per
element), so a few hundred MB of one-byte elements would cost tens of GB. Here every count is checked
against the bytes left in the file *before* anything is read or allocated, and array elements in total
are capped. Tensor records are checked too: known type, at most 4 dimensions, rows whole blocks, data inside
the file, aligned, and no two tensors sharing bytes.
"""

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ridgeline.errors import ModelLoadError

MAGIC = b"GGUF"
VERSIONS = (2, 3)  # what gguf's reader handles
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
# The largest vocabularies in use have ~262k entries and three arrays (tokens, scores, types) plus merges:
# ~1M elements in all. 8M leaves room and keeps the reader's per-element objects under ~1 GB.
MAX_ARRAY_ELEMENTS = 1 << 23
MAX_NESTING = 2  # arrays of arrays (the format allows them; no model uses deeper)
SCALAR_FORMATS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}


@dataclass(frozen=True)
class TensorRecord:
    name: str
    qtype: GGMLQuantizationType
    dims: tuple[int, ...]  # innermost first, as stored
    offset: int  # from the start of the data section
    n_bytes: int


class _Header:
    """A cursor over the file's bytes that refuses to read past the end."""

    def __init__(self, path: Path, data: memoryview):
        self.path = path
        self.data = data
        self.at = 0
        self.order = "<"
        self.array_elements = 0

    def fail(self, problem: str) -> ModelLoadError:
        return ModelLoadError(f"{self.path} is not a valid GGUF file: {problem}")

    def take(self, size: int, what: str) -> memoryview:
        if size < 0 or self.at + size > len(self.data):
            raise self.fail(f"{what} at byte {self.at} runs past the end of the file ({len(self.data)} bytes; truncated?)")
        chunk = self.data[self.at : self.at + size]
        self.at += size
        return chunk

    def scalar(self, fmt: str, what: str):
        return struct.unpack(self.order + fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.scalar("Q", f"length of {what}")
        try:
            return str(self.take(length, what), "utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {self.at - length} is not UTF-8") from None

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.scalar("I", f"type of {what}")
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.fail(f"{what} has unknown value type {raw}") from None

    def skip_value(self, kind: GGUFValueType, what: str, depth: int = 0) -> None:
        if kind == GGUFValueType.STRING:
            self.take(self.scalar("Q", f"length of {what}"), what)
        elif kind in SCALAR_FORMATS:
            self.take(struct.calcsize(SCALAR_FORMATS[kind]), what)
        else:  # array
            if depth >= MAX_NESTING:
                raise self.fail(f"{what} nests arrays more than {MAX_NESTING} deep")
            item = self.value_type(f"elements of {what}")
            count = self.scalar("Q", f"length of {what}")
            smallest = struct.calcsize(SCALAR_FORMATS[item]) if item in SCALAR_FORMATS else 8  # string/array: 8+
            if count * smallest > len(self.data) - self.at:
                raise self.fail(f"{what} claims {count} elements, more than the {len(self.data) - self.at} bytes left hold")
            self.array_elements += count
            if self.array_elements > MAX_ARRAY_ELEMENTS:
                raise self.fail(f"metadata arrays hold more than {MAX_ARRAY_ELEMENTS} elements in all")
            if item in SCALAR_FORMATS:
                self.take(count * smallest, what)
            elif item == GGUFValueType.STRING:
                self._skip_strings(count, what)
            else:
                for _ in range(count):
                    self.skip_value(item, what, depth + 1)


    def _skip_strings(self, count: int, what: str) -> None:
        # The hot case (a vocabulary: ~262k strings), so one tight loop rather than a call per string.
        length, data, at, end = struct.Struct(self.order + "Q"), self.data, self.at, len(self.data)
        for _ in range(count):
            if at + 8 > end or (at := at + 8 + length.unpack_from(data, at)[0]) > end:
                self.at = min(at, end)
                raise self.fail(f"{what} runs past the end of the file ({end} bytes; truncated?)")
        self.at = at


def check_gguf(path: Path) -> list[TensorRecord]:
    """Raise ModelLoadError naming the first problem with the file's layout; return its tensor records."""
    with open(path, "rb") as file:
        size = file.seek(0, 2)
        if size == 0:
            raise ModelLoadError(f"{path} is not a valid GGUF file: it is empty")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                return _check(_Header(path, view), size)
            finally:
                view.release()


def _check(header: _Header, file_size: int) -> list[TensorRecord]:
    if bytes(header.take(4, "magic")) != MAGIC:
        raise header.fail("it does not start with the GGUF magic")
    version = header.scalar("I", "version")
    if version & 0xFFFF == 0:  # written on a machine of the other byte order (as gguf's reader detects it)
        header.order = ">"
        version = struct.unpack(">I", struct.pack("<I", version))[0]
    if version not in VERSIONS:
        raise header.fail(f"GGUF version {version} is not supported (supported: {', '.join(map(str, VERSIONS))})")
    tensor_count = header.scalar("Q", "tensor count")
    kv_count = header.scalar("Q", "metadata count")
    # Each metadata entry takes at least 13 bytes (key length, type, one byte); each tensor record 24.
    if kv_count * 13 + tensor_count * 24 > file_size - header.at:
        raise header.fail(f"it claims {kv_count} metadata entries and {tensor_count} tensors, more than the file holds")

    alignment = DEFAULT_ALIGNMENT
    keys: set[str] = set()
    for _ in range(kv_count):
        key = header.string("metadata key")
        if key in keys:
            raise header.fail(f"metadata key {key!r} appears twice")
        keys.add(key)
        kind = header.value_type(f"metadata {key!r}")
        start = header.at
        header.skip_value(kind, f"metadata {key!r}")
        if key == "general.alignment":
            if kind != GGUFValueType.UINT32:
                raise header.fail(f"general.alignment has type {kind.name}, not UINT32")
            alignment = struct.unpack(header.order + "I", header.data[start : start + 4])[0]
            if alignment == 0 or alignment & (alignment - 1):
                raise header.fail(f"general.alignment {alignment} is not a power of two")

    records = [_tensor_record(header) for _ in range(tensor_count)]
    data_start = -(-header.at // alignment) * alignment
    names: set[str] = set()
    for record in records:
        if record.name in names:
            raise header.fail(f"tensor {record.name!r} appears twice")
        names.add(record.name)
        if record.offset % alignment:
            raise header.fail(f"tensor {record.name!r} starts at offset {record.offset}, not a multiple of {alignment}")
        if data_start + record.offset + record.n_bytes > file_size:
            raise header.fail(f"tensor {record.name!r} runs past the end of the file (truncated?)")
    by_offset = sorted(records, key=lambda r: r.offset)
    for first, second in zip(by_offset, by_offset[1:]):
        if first.offset + first.n_bytes > second.offset:
            raise header.fail(f"tensors {first.name!r} and {second.name!r} share bytes")
    return records


def _tensor_record(header: _Header) -> TensorRecord:
    name = header.string("tensor name")
    n_dims = header.scalar("I", f"dimension count of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise header.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS} allowed)")
    dims = tuple(header.scalar("Q", f"dimensions of tensor {name!r}") for _ in range(n_dims))
    raw_type = header.scalar("I", f"type of tensor {name!r}")
    offset = header.scalar("Q", f"offset of tensor {name!r}")
    try:
        qtype = GGMLQuantizationType(raw_type)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise header.fail(f"tensor {name!r} has unknown type {raw_type}") from None
    if dims[0] % block:
        raise header.fail(f"tensor {name!r} has rows of {dims[0]} values, not whole {qtype.name} blocks of {block}")
    elements = 1
    for dim in dims:
        elements *= dim  # Python ints: a product that would overflow 64 bits is caught below, not wrapped
    n_bytes = elements // block * block_bytes
    if n_bytes > len(header.data):
        raise header.fail(f"tensor {name!r} of shape {list(dims)} needs {n_bytes} bytes, more than the whole file")
    return TensorRecord(name, qtype, dims, offset, n_bytes)
