"""The KV pool's pages faulted in ahead of use (engine/kv_populate.py): every page of the pool becomes resident,
no byte changes (a page the engine already wrote keeps its KV), and the pages go in the order fresh pages are
handed out."""

import ctypes
import mmap
import sys

import numpy as np
import pytest
import torch

from ridgeline.engine.kv_cache import KVCache, KVCacheConfig
from ridgeline.engine.kv_populate import CHUNK_SLOTS, OS_PAGE, byte_ranges, populate, slot_ranges
from ridgeline.model.config import ModelConfig

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="MADV_POPULATE_WRITE and mincore are Linux's")


def resident_share(tensor: torch.Tensor) -> float:
    """The share of the tensor's whole OS pages that are in memory (mincore)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    start = -(-tensor.data_ptr() // OS_PAGE) * OS_PAGE
    stop = (tensor.data_ptr() + tensor.numel() * tensor.element_size()) // OS_PAGE * OS_PAGE
    pages = (stop - start) // OS_PAGE
    vector = ctypes.create_string_buffer(pages)
    assert libc.mincore(start, stop - start, vector) == 0, ctypes.get_errno()
    return sum(byte & 1 for byte in vector.raw) / pages


def release_pages(tensor: torch.Tensor) -> None:
    """Hands the tensor's whole OS pages back to the kernel (they read as zeros again)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = -(-tensor.data_ptr() // OS_PAGE) * OS_PAGE
    stop = (tensor.data_ptr() + tensor.numel() * tensor.element_size()) // OS_PAGE * OS_PAGE
    assert libc.madvise(start, stop - start, mmap.MADV_DONTNEED) == 0, ctypes.get_errno()


def kernel_can_populate() -> bool:
    probe = np.zeros(4 * mmap.PAGESIZE, dtype=np.uint8)
    return populate([torch.from_numpy(probe).view(1, -1, 1)])


@pytest.fixture
def model() -> ModelConfig:
    return ModelConfig(architecture="llama", vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=3,
                       num_heads=4, num_kv_heads=2, head_dim=64, max_context=4096, rms_norm_eps=1e-6, rope_theta=1e4)


@pytest.mark.parametrize("dtype", ["bf16", "q8_0"])
def test_populate_makes_the_whole_pool_resident_and_changes_no_byte(model, dtype):
    if not kernel_can_populate():
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
    cache = KVCache(model, KVCacheConfig(16, dtype, 64 << 20), num_pages=8192, device=torch.device("cpu"))
    # Zero pages: nothing of a fresh mapping is resident yet (allocations past glibc's 32 MiB mmap threshold; a
    # smaller one, Q8_0's scales, may reuse memory a test before freed). The kernel may still have faulted some in
    # (CI once found a fresh Q8_0 pool resident: transparent huge pages collapsed by khugepaged), so the test hands
    # them back first: MADV_DONTNEED on private anonymous memory leaves zeros, which is what the pool holds.
    fresh = [tensor for tensor in cache.tensors if tensor.numel() * tensor.element_size() > 32 << 20]
    for tensor in fresh:
        release_pages(tensor)
    assert fresh and all(resident_share(tensor) < 0.05 for tensor in fresh)
    first = cache.tensors[0]
    first[1, 5].fill_(3)  # KV the engine wrote before the thread reached its page
    assert populate(cache.tensors)
    assert all(resident_share(tensor) == 1.0 for tensor in cache.tensors)
    assert torch.equal(first[1, 5], torch.full_like(first[1, 5], 3))
    written = first.clone()
    written[1, 5] = 0
    assert not written.any() and not any(tensor.any() for tensor in cache.tensors[1:] if tensor is not first)


def test_slot_ranges_run_from_the_pool_start_up_as_the_block_manager_hands_out_fresh_pages():
    ranges = list(slot_ranges(2500, chunk=1024))
    assert ranges == [(0, 1024), (1024, 2048), (2048, 2500)]
    assert list(slot_ranges(3 * CHUNK_SLOTS))[-1] == (2 * CHUNK_SLOTS, 3 * CHUNK_SLOTS)


def test_byte_ranges_cover_a_slot_range_of_every_layer_in_whole_pages_within_the_tensor():
    storage = np.zeros(3 * 1000 * 64 + OS_PAGE, dtype=np.float32)
    offset = (-storage.ctypes.data % OS_PAGE) // 4 + 5  # a tensor starting 20 bytes into a page
    tensor = torch.from_numpy(storage[offset:offset + 3 * 1000 * 64]).view(3, 1000, 64)  # 256-byte slots
    base, layer = tensor.data_ptr(), 1000 * 256
    ranges = byte_ranges(tensor, 100, 200)
    assert len(ranges) == 3
    for index, (start, stop) in enumerate(ranges):
        assert start % OS_PAGE == 0 and stop % OS_PAGE == 0
        assert start <= base + index * layer + 100 * 256 and stop >= base + index * layer + 200 * 256
        assert stop - start < 100 * 256 + 2 * OS_PAGE
    first, last = byte_ranges(tensor, 0, 1)[0], byte_ranges(tensor, 999, 1000)[-1]
    assert first[0] >= base and last[1] <= base + tensor.numel() * 4  # never past the tensor's own pages
