"""Hostile model files: each broken or malicious GGUF / config.json ends in one ModelLoadError line, without
trusting a header's counts (no hang, no allocation sized by a claim); the crashers fuzzing found stay fixed;
and a short coverage-guided run of each atheris target is green."""

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz.seeds import CRASHER_GGUFS, seed_hf_configs, write_seed_gguf, write_seed_safetensors
from gguf import GGMLQuantizationType, GGUFValueType

from ridgeline.errors import ModelLoadError
from ridgeline.model.checkpoint import read_checkpoint
from ridgeline.model.hf_loader import load_hf_dir

TESTS = Path(__file__).parent
FUZZ_DATA = TESTS / "data" / "fuzz"
U32, U64, STR, ARR = GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.STRING, GGUFValueType.ARRAY


def load(path: Path) -> None:
    checkpoint = read_checkpoint(path)
    checkpoint.load_tokenizer()


def refused(path: Path, message: str) -> str:
    with pytest.raises(ModelLoadError, match=message) as caught:
        load(path)
    assert "\n" not in str(caught.value)
    return str(caught.value)


# ------------------------------------------------------------------ hand-built headers


def text(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str | bytes, kind: int, payload: bytes) -> bytes:
    return text(key) + struct.pack("<I", kind) + payload


def tensor(name: str, dims: list[int], qtype: int = GGMLQuantizationType.F32, offset: int = 0) -> bytes:
    return text(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", qtype, offset)


def gguf_bytes(kvs: list[bytes] = (), tensors: list[bytes] = (), data: bytes = b"", *, version: int = 3,
               tensor_count: int | None = None, kv_count: int | None = None, alignment: int = 32) -> bytes:
    header = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if tensor_count is None else tensor_count,
                                   len(kvs) if kv_count is None else kv_count)
    body = header + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % alignment) + data


ARCH = kv("general.architecture", STR, text("llama"))
HEADERS = {
    "empty": (b"", "empty"),
    "not_gguf": (b"PK\x03\x04" + b"\0" * 60, "magic"),
    "version_1": (gguf_bytes(version=1), "version 1 is not supported"),
    "header_cut": (b"GGUF\x03\0\0\0\x01", "runs past the end"),
    "tensor_count_2e63": (gguf_bytes([ARCH], tensor_count=2**63), "claims"),
    "kv_count_max": (gguf_bytes([ARCH], kv_count=2**64 - 1), "claims"),
    "key_length_2e63": (gguf_bytes([struct.pack("<Q", 2**63) + b"abc"]), "runs past the end"),
    "value_length_2e62": (gguf_bytes([kv("general.name", STR, struct.pack("<Q", 2**62) + b"x")]), "runs past the end"),
    "u8_array_2e60": (gguf_bytes([kv("a", ARR, struct.pack("<IQ", GGUFValueType.UINT8, 2**60))]), "claims 1152921504606846976 elements"),
    "string_array_2e40": (gguf_bytes([kv("a", ARR, struct.pack("<IQ", STR, 2**40) + text("x"))]), "claims"),
    "string_array_cut": (gguf_bytes([kv("a", ARR, struct.pack("<IQ", STR, 3) + text("x") + struct.pack("<Q", 999))]), "past the end"),
    "arrays_3_deep": (gguf_bytes([kv("a", ARR, struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", ARR, 1) + struct.pack("<IQ", U32, 0))]), "nests arrays"),
    "unknown_value_type": (gguf_bytes([kv("a", 99, b"\0" * 8)]), "unknown value type 99"),
    "duplicate_key": (gguf_bytes([ARCH, ARCH]), "appears twice"),
    "key_not_utf8": (gguf_bytes([kv(b"\xff\xfe", U32, b"\0" * 4)]), "not UTF-8"),
    "alignment_3": (gguf_bytes([kv("general.alignment", U32, struct.pack("<I", 3))]), "not a power of two"),
    "alignment_as_string": (gguf_bytes([kv("general.alignment", STR, text("32"))]), "not UINT32"),
    "five_dims": (gguf_bytes([ARCH], [tensor("t", [1, 1, 1, 1, 1])], b"\0" * 32), "5 dimensions"),
    "dims_overflow_u64": (gguf_bytes([ARCH], [tensor("t", [2**40, 2**40, 2**40])], b"\0" * 32), "more than the whole file"),
    "offset_out_of_file": (gguf_bytes([ARCH], [tensor("t", [8], offset=2**40)], b"\0" * 32), "runs past the end"),
    "tensors_overlap": (gguf_bytes([ARCH], [tensor("a", [8]), tensor("b", [8], offset=0)], b"\0" * 64), "share bytes"),
    "offset_misaligned": (gguf_bytes([ARCH], [tensor("a", [8], offset=4)], b"\0" * 64), "not a multiple of 32"),
    "unknown_tensor_type": (gguf_bytes([ARCH], [tensor("a", [8], qtype=1234)], b"\0" * 64), "unknown type 1234"),
    "partial_quant_block": (gguf_bytes([ARCH], [tensor("a", [33], qtype=GGMLQuantizationType.Q8_0)], b"\0" * 64), "whole Q8_0 blocks"),
    "duplicate_tensor": (gguf_bytes([ARCH], [tensor("a", [8]), tensor("a", [8], offset=32)], b"\0" * 64), "appears twice"),
}


@pytest.mark.parametrize("name", HEADERS)
def test_hostile_headers_are_refused_before_the_reader_trusts_them(tmp_path, name):
    data, message = HEADERS[name]
    (tmp_path / "m.gguf").write_bytes(data)
    refused(tmp_path / "m.gguf", message)


def test_every_truncation_of_a_valid_file_is_refused(tmp_path):
    whole = write_seed_gguf(tmp_path / "seed.gguf").read_bytes()
    load(tmp_path / "seed.gguf")
    for cut in [*range(0, 200, 7), *range(200, len(whole), 97)]:
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(whole[:cut])
        refused(path, "GGUF file")


# ------------------------------------------------------------------ known keys with the wrong type or range

F32, I32, BOOL = GGUFValueType.FLOAT32, GGUFValueType.INT32, GGUFValueType.BOOL
WRONG_VALUES = {
    "hidden_as_string": ({"llama.embedding_length": ("32", STR)}, "embedding_length should be an integer"),
    "zero_heads": ({"llama.attention.head_count": (0, U32)}, "head_count = 0 is out of range"),
    "heads_do_not_split": ({"llama.attention.head_count_kv": (3, U32)}, "do not split into 3 KV heads"),
    "context_as_float": ({"llama.context_length": (64.0, F32)}, "context_length should be an integer"),
    "eps_nan": ({"llama.attention.layer_norm_rms_epsilon": (float("nan"), F32)}, "finite number"),
    "million_layers": ({"llama.block_count": (10**6, U32)}, "block_count = 1000000 is out of range"),
    "layers_disagree": ({"llama.block_count": (2, U32)}, "says 2 layers, the file has tensors for 1"),
    "hidden_disagrees": ({"llama.embedding_length": (64, U32)}, "has shape .* the config implies"),
    "odd_head_dim": ({"llama.attention.key_length": (15, U32)}, "head_dim 15 is odd"),
    "tokens_as_numbers": ({"tokenizer.ggml.tokens": ([1, 2, 3], ARR)}, "tokenizer.ggml.tokens"),
    "no_tokens": ({"tokenizer.ggml.tokens": None}, "lacks tokenizer.ggml.tokens"),
    "bos_out_of_vocab": ({"tokenizer.ggml.bos_token_id": (10**6, U32)}, "outside the vocabulary of 8"),
    "bos_as_string": ({"tokenizer.ggml.bos_token_id": ("1", STR)}, "bos_token_id has the wrong type"),
    "types_too_short": ({"tokenizer.ggml.token_type": ([1, 1], ARR)}, "one int per token"),
    "scores_as_strings": ({"tokenizer.ggml.scores": (["a"] * 8, ARR)}, "one int or float per token"),
    "byte_token_malformed": ({"tokenizer.ggml.token_type": ([6] * 8, ARR)}, "not <0xNN>"),
    "template_as_number": ({"tokenizer.chat_template": (7, U32)}, "chat_template has the wrong type"),
    "model_as_number": ({"tokenizer.ggml.model": (1, U32)}, "tokenizer.ggml.model has the wrong type"),
    "add_bos_as_string": ({"tokenizer.ggml.add_bos_token": ("yes", STR)}, "add_bos_token has the wrong type"),
}


@pytest.mark.parametrize("name", WRONG_VALUES)
def test_known_keys_with_the_wrong_type_or_range_are_refused_by_name(tmp_path, name):
    overrides, message = WRONG_VALUES[name]
    refused(write_seed_gguf(tmp_path / "m.gguf", overrides=overrides), message)


@pytest.mark.parametrize("merges", [[1, 2], ["ab"], ["zz qq", "a b"]], ids=["numbers", "no_space", "unknown_pieces"])
def test_a_bpe_file_with_malformed_merges_is_refused_or_loads(tmp_path, merges):
    path = write_seed_gguf(tmp_path / "m.gguf", "qwen2", "bpe", overrides={"tokenizer.ggml.merges": (merges, ARR)})
    try:
        load(path)  # merges of pieces the vocabulary lacks may be legal to the library: then it must just load
    except ModelLoadError as error:
        assert "merges" in str(error) or "malformed" in str(error)
        assert "\n" not in str(error)


# ------------------------------------------------------------------ what fuzzing found


@pytest.mark.parametrize("name", sorted(CRASHER_GGUFS))
def test_gguf_crashers_found_by_fuzzing_stay_fixed(tmp_path, name):
    write, message = CRASHER_GGUFS[name]
    refused(write(tmp_path / "m.gguf"), message)


@pytest.mark.parametrize("path", sorted((FUZZ_DATA / "hf_config").glob("*.json")), ids=lambda p: p.stem)
def test_config_json_crashers_found_by_fuzzing_stay_fixed(tmp_path, path):
    write_seed_safetensors(tmp_path / "model.safetensors", seed_hf_configs()[0])
    shutil.copy(path, tmp_path / "config.json")
    with pytest.raises(ModelLoadError) as caught:
        load_hf_dir(tmp_path)
    assert "\n" not in str(caught.value)


def test_the_seed_configs_load(tmp_path):
    seed = seed_hf_configs()[0]
    write_seed_safetensors(tmp_path / "model.safetensors", seed)
    (tmp_path / "config.json").write_text(json.dumps(seed))
    config, _ = load_hf_dir(tmp_path)
    assert config.num_layers == seed["num_hidden_layers"]


# ------------------------------------------------------------------ short coverage-guided runs


@pytest.mark.parametrize("target, runs", [("fuzz_gguf.py", 3000), ("fuzz_hf_config.py", 1500), ("fuzz_constraints.py", 600)])
def test_a_short_atheris_run_finds_nothing(target, runs):
    pytest.importorskip("atheris")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent / "src"), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, str(TESTS / "fuzz" / target), f"-runs={runs}", "-seed=1"],
        capture_output=True, text=True, timeout=600, env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Done {runs} runs" in result.stderr
