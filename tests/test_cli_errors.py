"""Bad input to the CLI gives one line naming the problem and a non-zero exit, never a traceback."""

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from tiny_models import build_hf_model, save_tokenizer

RIDGELINE = str(Path(sys.executable).parent / "ridgeline")


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([RIDGELINE, *args], capture_output=True, text=True, timeout=300)


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def write_gguf(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, gguf.GGMLQuantizationType | None]]) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(32)
    writer.add_feed_forward_length(64)
    writer.add_head_count(2)
    writer.add_layer_norm_rms_eps(1e-6)
    for name, (data, raw_type) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "llama",
                      {"token_embd.weight": (np.zeros((16, 32), np.float32), None)})


def test_missing_model_file(tmp_path):
    assert_one_line_error(run_cli("inspect", str(tmp_path / "nope.gguf")), "not found", "nope.gguf")


def test_truncated_gguf(tmp_path, model_file):
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(model_file.read_bytes()[:-100])
    assert_one_line_error(run_cli("inspect", str(truncated)), "truncated")


def test_file_that_is_not_gguf(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not a model" * 10)
    assert_one_line_error(run_cli("inspect", str(junk)), "junk.gguf")


def test_unsupported_architecture(tmp_path):
    path = write_gguf(tmp_path / "mamba.gguf", "mamba", {"token_embd.weight": (np.zeros((16, 32), np.float32), None)})
    assert_one_line_error(run_cli("inspect", str(path)), "unsupported architecture", "mamba")


def test_unsupported_tensor_type(tmp_path):
    iq2_xxs = gguf.GGMLQuantizationType.IQ2_XXS  # a type still not read
    block_bytes = gguf.GGML_QUANT_SIZES[iq2_xxs][1]
    path = write_gguf(tmp_path / "iq2.gguf", "llama", {"token_embd.weight": (np.zeros((16, block_bytes), np.uint8), iq2_xxs)})
    assert_one_line_error(run_cli("inspect", str(path)), "unsupported type", "IQ2_XXS")


def test_prompt_longer_than_context(tmp_path):
    build_hf_model("llama", tmp_path)  # context of 256 tokens
    save_tokenizer(tmp_path)
    result = run_cli("generate", "the quick brown fox " * 300, "--model", str(tmp_path), "-n", "4")
    assert_one_line_error(result, "exceeds the context")


def test_bad_sampling_value():
    assert_one_line_error(run_cli("generate", "hi", "--top-p", "7"), "top_p")


def test_unknown_lm_head_format(tmp_path):
    build_hf_model("llama", tmp_path)
    save_tokenizer(tmp_path)
    assert_one_line_error(run_cli("generate", "hi", "--model", str(tmp_path), "--lm-head", "q3"), "unknown --lm-head 'q3'")


@pytest.mark.parametrize("args", [("serve", "--kv-cache-dtype", "q4"), ("generate", "hi", "--kv-cache-dtype-v", "q4")])
def test_unknown_kv_cache_dtype(args):
    assert_one_line_error(run_cli(*args), "unknown KV cache dtype 'q4'", "q8_0")


def test_roofline_kv_bytes_that_is_neither_a_number_nor_a_kv_dtype():
    assert_one_line_error(run_cli("roofline", "--hardware", "nvidia-dgx-spark", "--kv-bytes", "q4"), "--kv-bytes", "q8_0")


@pytest.mark.parametrize("value", ["fast", "-20"])
def test_bad_itl_target(value):
    assert_one_line_error(run_cli("serve", "--itl-target-ms", value), "--itl-target-ms takes a number of milliseconds",
                          repr(value))
