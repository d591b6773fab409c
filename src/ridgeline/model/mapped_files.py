"""Which file, and where in it, a weight's bytes were mapped from.

The packed-weight cache names an entry by what it was packed from. Hashing the stored bytes gives that name, but
on a warm start it reads every byte of the model file (~0.8 s for the default model) and, worse, leaves every
page of the file resident in the process beside the packed copy that is actually used: a 1.0 GB model started
at ~2 GB of RSS. A weight mapped straight from a file is named as well, and for free, by the file's identity
(path, size, modification time, inode: what the GGUF index cache already trusts) and the bytes' offset in it.

Each memory map of a model file is registered here with that identity. A weight's byte pieces are located by
their addresses. The registry holds the map only weakly: while any weight views it, the map (and so the address
range) is alive and still that file's; once the map is freed its entry is gone, so an address reused by a later
mapping is never taken for the old file.
"""

from __future__ import annotations

import mmap
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only locate() takes a tensor; tokenizers map files through here without torch
    import torch


@dataclass(frozen=True)
class FilePlace:
    identity: str  # the file's identity when it was mapped
    offset: int
    nbytes: int


_lock = threading.Lock()
_maps: dict[int, tuple[int, str, weakref.ref]] = {}  # start address -> (length, identity, the mapping)


def register(mapping: mmap.mmap, start: int, identity: str) -> None:
    """Records that `mapping` (a whole-file map, offset 0, at address `start`) holds the file named by `identity`.
    Only a weak reference is kept: the mapping lives as long as the arrays viewing it."""
    length = len(mapping)

    def forget(ref, start=start):
        with _lock:
            if _maps.get(start, (0, "", None))[2] is ref:
                del _maps[start]

    with _lock:
        _maps[start] = (length, identity, weakref.ref(mapping, forget))


def locate(tensor: torch.Tensor) -> FilePlace | None:
    """Where in a registered file the tensor's bytes lie, or None (not contiguous, or not from a mapped file)."""
    if not tensor.is_contiguous() or tensor.device.type != "cpu":
        return None
    address, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    with _lock:
        for start, (length, identity, ref) in _maps.items():
            if start <= address and address + nbytes <= start + length and ref() is not None:
                return FilePlace(identity, address - start, nbytes)
    return None
