"""What a warm start reads instead of recomputing: the GGUF index (metadata, vocabulary, tensor places) and packed
weights. A cache hit gives exactly what a cold start computes; a stale or corrupt entry is never used."""

import os
import warnings

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

from ridgeline import startup_clock
from ridgeline.engine.kv_cache import zeroed
from ridgeline.model import gguf_index, native
from ridgeline.model.gguf_loader import load_gguf
from ridgeline.model.quant import pack_cache
from ridgeline.model.quant.packing import pack
from ridgeline.model.quant.random_blocks import random_stored
from ridgeline.model.tokenizer import tokenizer_from_gguf
from ridgeline.model.weights import StoredTensor

SAMPLES = ["Hello world", "  ab ab  ", "naïve café 日本語 🚀", "line one\n\tline two", "</s>ab", "bab aab"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(native, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(gguf_index, "MIN_CACHED_FILE_BYTES", 0)  # the test files are tiny
    return tmp_path / "cache"


def write_model(path, score_of_ab: float = -2.0) -> None:
    """A GGUF with an SPM vocabulary, a few metadata fields and a dense and a quantised tensor (no layers)."""
    pieces = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], "▁", "a", "b", "▁a", "ab", "▁ab"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * 6
    writer = gguf.GGUFWriter(path, "llama")
    for add, value in [(writer.add_block_count, 0), (writer.add_context_length, 64), (writer.add_embedding_length, 32),
                       (writer.add_feed_forward_length, 64), (writer.add_head_count, 2),
                       (writer.add_layer_norm_rms_eps, 1e-6)]:
        add(value)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores([0.0] * 259 + [-1.0, -2.0, -2.0, -3.0, score_of_ab, -5.0])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_space_prefix(True)
    writer.add_tensor("output_norm.weight", np.arange(32, dtype=np.float32))
    quantised = random_stored(T.Q8_0, (len(pieces), 32), seed=3)
    writer.add_tensor("token_embd.weight", quantised.data.numpy(), raw_dtype=T.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def assert_same_tokenizer(a, b) -> None:
    for text in SAMPLES:
        for special in (False, True):
            ids = a.encode(text, special=special)
            assert b.encode(text, special=special) == ids
            assert b.decode(ids) == a.decode(ids) and b.decode(ids, skip_special=False) == a.decode(ids, False)
    assert (a.vocab_size, a.bos_id, a.eos_ids, a.add_bos) == (b.vocab_size, b.bos_id, b.eos_ids, b.add_bos)


def test_a_warm_load_gives_what_the_file_gives(tmp_path, private_cache, monkeypatch):
    path = tmp_path / "model.gguf"
    write_model(path)
    cold_config, cold_tensors, cold_fields = load_gguf(path)
    assert list((private_cache / "gguf_index").glob("*.pickle"))

    def no_parsing(*args):
        raise AssertionError("the warm load parsed the file")

    monkeypatch.setattr(gguf_index, "index_from_file", no_parsing)
    warm_config, warm_tensors, warm_fields = load_gguf(path)
    assert warm_config == cold_config
    assert warm_fields == cold_fields
    assert warm_tensors.keys() == cold_tensors.keys()
    for name, tensor in cold_tensors.items():
        assert (warm_tensors[name].qtype, warm_tensors[name].shape) == (tensor.qtype, tensor.shape)
        assert torch.equal(warm_tensors[name].data, tensor.data)
    assert_same_tokenizer(tokenizer_from_gguf(gguf.GGUFReader(path)), tokenizer_from_gguf(warm_fields))


def test_a_changed_file_is_read_again(tmp_path):
    path = tmp_path / "model.gguf"
    write_model(path, score_of_ab=-2.0)
    first = gguf_index.load_index(path)
    write_model(path, score_of_ab=-7.0)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))  # even within one tick
    second = gguf_index.load_index(path)
    assert second.identity != first.identity
    assert second.fields["tokenizer.ggml.scores"][-2] == -7.0
    assert len(list(gguf_index.cache_path(path).parent.iterdir())) == 1  # replaced, not piled up


@pytest.mark.parametrize("damage", [b"", b"not a pickle", b"\x80\x05garbage"])
def test_a_corrupt_index_is_ignored_and_rebuilt(tmp_path, damage):
    path = tmp_path / "model.gguf"
    write_model(path)
    expected = gguf_index.load_index(path)
    gguf_index.cache_path(path).write_bytes(damage)
    with pytest.warns(UserWarning, match="unreadable GGUF index"):
        rebuilt = gguf_index.load_index(path)
    assert rebuilt == expected
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten entry reads cleanly
        assert gguf_index.load_index(path) == expected


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_K, T.Q6_K])
def test_cached_packing_equals_packing(qtype, monkeypatch):
    weight = random_stored(qtype, (512, 1024), seed=5)
    assert weight.nbytes >= pack_cache.MIN_CACHED_BYTES
    fresh = pack(weight)
    first = pack_cache.cached_pack(weight)
    monkeypatch.setattr(pack_cache, "pack", lambda w: pytest.fail("the second call packed again"))
    second = pack_cache.cached_pack(weight)
    for expected, a, b in zip(fresh.planes, first.planes, second.planes):
        assert torch.equal(a, expected) and torch.equal(b, expected) and b.dtype == expected.dtype
    other = random_stored(qtype, (512, 1024), seed=6)
    assert pack_cache.entry_path(other) != pack_cache.entry_path(weight)  # other bytes, other entry


def test_a_corrupt_packed_entry_is_ignored_and_rewritten():
    weight = random_stored(T.Q4_K, (512, 1024), seed=7)
    expected = pack(weight)
    pack_cache.cached_pack(weight)
    pack_cache.entry_path(weight).write_bytes(b"PK\x03\x04 truncated")
    with pytest.warns(UserWarning, match="unreadable packed-weight"):
        again = pack_cache.cached_pack(weight)
    assert all(torch.equal(a, b) for a, b in zip(again.planes, expected.planes))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pack_cache.cached_pack(weight)


def test_cached_dense_copy_equals_dequantising(monkeypatch):
    """Where the compiled kernels do not run, layers compute with a float32 copy: cached the same way."""
    weight = random_stored(T.Q4_K, (512, 1024), seed=8)
    expected = weight.dequantize(torch.float32)
    assert torch.equal(pack_cache.cached_dense(weight), expected)
    path = pack_cache.entry_path(weight, "dense").with_suffix(".npy")
    with monkeypatch.context() as patch:
        patch.setattr(StoredTensor, "dequantize", lambda *args: pytest.fail("the second call dequantised again"))
        assert torch.equal(pack_cache.cached_dense(weight), expected)
    path.write_bytes(path.read_bytes()[:1000])  # truncated
    with pytest.warns(UserWarning, match="unreadable dense-weight"):
        assert torch.equal(pack_cache.cached_dense(weight), expected)
    assert torch.equal(pack_cache.cached_dense(weight), expected)


def test_small_weights_and_files_are_not_cached(tmp_path, private_cache, monkeypatch):
    pack_cache.cached_pack(random_stored(T.Q4_0, (16, 64), seed=1))
    assert not (private_cache / "packed").exists()
    monkeypatch.setattr(gguf_index, "MIN_CACHED_FILE_BYTES", 32 * 1024 * 1024)
    write_model(tmp_path / "model.gguf")
    load_gguf(tmp_path / "model.gguf")
    assert not (private_cache / "gguf_index").exists()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kv_memory_starts_as_zeros(dtype):
    data = zeroed((2, 3, 5, 7), dtype, torch.device("cpu"))
    assert data.shape == (2, 3, 5, 7) and data.dtype == dtype and not data.any()
    data[1, 2] = 1.5
    assert data.sum().item() == 1.5 * 35


def test_startup_phases_leave_out_the_phases_inside_them(monkeypatch):
    clock = iter([0.0, 1.0, 3.0, 10.0])  # load starts, kernels start, kernels end, load ends
    monkeypatch.setattr(startup_clock.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(startup_clock, "_spent", {})
    with startup_clock.phase("load weights"):
        with startup_clock.phase("kernels"):
            pass
    assert startup_clock.spent() == {"load weights": 8.0, "kernels": 2.0}
    line = startup_clock.describe(12.0)
    assert line == "start-up 12.00 s: load weights 8.00 s, kernels 2.00 s, other (imports, server set-up) 2.00 s"


def test_a_weight_mapped_from_a_file_is_named_by_its_place_without_reading_it(tmp_path, monkeypatch):
    """Hashing the bytes read the whole model on every warm start and kept its pages resident beside the packed
    copy (model/mapped_files.py); a mapped weight is named by its file's identity and offset instead."""
    path = tmp_path / "model.gguf"
    write_model(path)
    monkeypatch.setattr(pack_cache, "MIN_CACHED_BYTES", 0)
    weight = load_gguf(path)[1]["token_embd.weight"]
    copy = StoredTensor(weight.qtype, weight.shape, weight.data.clone())  # the same bytes, held in memory
    by_bytes = pack_cache.entry_path(copy)
    with monkeypatch.context() as patch:
        patch.setattr(pack_cache, "memoryview", lambda *args: pytest.fail("read the mapped bytes"), raising=False)
        by_place = pack_cache.entry_path(weight)
        assert by_place != by_bytes
        packed = pack_cache.cached_pack(weight)
        assert all(torch.equal(a, b) for a, b in zip(packed.planes, pack(copy).planes))
        del weight
        again = load_gguf(path)[1]["token_embd.weight"]  # a warm start: another map of the same file
        assert pack_cache.entry_path(again) == by_place
        patch.setattr(pack_cache, "pack", lambda w: pytest.fail("the warm start packed again"))
        pack_cache.cached_pack(again)
    del again
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))  # the file may have changed
    assert pack_cache.entry_path(load_gguf(path)[1]["token_embd.weight"]) != by_place
