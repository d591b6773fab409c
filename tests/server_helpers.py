"""A real server over a tiny random-weight model on a free loopback port, for the server tests.

The model is a 2-layer llama written as GGUF with a small byte-level BPE vocabulary (so any text encodes), built
once per test session in a temporary directory: fast to load and fast to step, with the full engine underneath.
"""

import contextlib
import functools
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gguf
import numpy as np
from tokenizers import Tokenizer as HfBackend
from tokenizers import decoders, models, pre_tokenizers, trainers

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.scheduler import SchedulerConfig
from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.launcher import BackgroundServer

TINY_CONTEXT = 512
HIDDEN, FFN, HEADS, KV_HEADS, LAYERS = 64, 128, 4, 2, 2
HEAD_DIM = HIDDEN // HEADS
KV_BYTES_PER_TOKEN = 2 * KV_HEADS * HEAD_DIM * LAYERS * 4  # K and V, fp32
CORPUS = ["The quick brown fox jumps over the lazy dog. Once upon a time there was a prompt, a cache and a server."] * 20
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _tokenizer() -> HfBackend:
    backend = HfBackend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer)
    return backend


@functools.cache
def tiny_model_path(context: int = TINY_CONTEXT) -> Path:
    """A tiny llama GGUF with random weights and a real tokenizer (built once per session and context length)."""
    path = Path(tempfile.mkdtemp(prefix="ridgeline-tiny-")) / "tiny-llama.gguf"
    vocab = json.loads(_tokenizer().to_str())["model"]
    tokens = sorted(vocab["vocab"], key=vocab["vocab"].get)
    hidden, ffn, heads, kv_heads, layers, head_dim = HIDDEN, FFN, HEADS, KV_HEADS, LAYERS, HEAD_DIM

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10_000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL if i < 3 else gguf.TokenType.NORMAL for i in range(len(tokens))])
    writer.add_token_merges([" ".join(pair) for pair in vocab["merges"]])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(0)

    def add(name: str, *shape: int, scale: float = 0.2) -> None:
        data = np.ones(shape, np.float32) if len(shape) == 1 else rng.normal(0, scale, shape).astype(np.float32)
        writer.add_tensor(name, data)

    add("token_embd.weight", len(tokens), hidden, scale=1.0)
    add("output_norm.weight", hidden)
    add("output.weight", len(tokens), hidden)
    for i in range(layers):
        add(f"blk.{i}.attn_norm.weight", hidden)
        add(f"blk.{i}.attn_q.weight", hidden, hidden)
        add(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        add(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        add(f"blk.{i}.attn_output.weight", hidden, hidden)
        add(f"blk.{i}.ffn_norm.weight", hidden)
        add(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        add(f"blk.{i}.ffn_up.weight", ffn, hidden)
        add(f"blk.{i}.ffn_down.weight", hidden, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_engine(max_num_seqs: int = 64, num_blocks: int = 256, block_size: int = 16,
                max_model_len: int | None = None, kv_dtype: str = "fp32", context: int = TINY_CONTEXT) -> LLMEngine:
    config = EngineConfig(
        model=str(tiny_model_path(context)),
        max_model_len=max_model_len,
        kv_cache=KVCacheConfig(block_size=block_size, dtype=kv_dtype, memory_bytes=num_blocks * block_size * KV_BYTES_PER_TOKEN),
        scheduler=SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024),
    )
    return LLMEngine(config)


@contextlib.contextmanager
def serve_tiny_model(max_num_seqs: int = 64, num_blocks: int = 256, max_model_len: int | None = None,
                     kv_dtype: str = "fp32", context: int = TINY_CONTEXT, **server_options):
    """A BackgroundServer (with .url) over a fresh tiny engine; server_options are ServerConfig fields."""
    config = ServerConfig(**server_options)
    app = create_app(tiny_engine(max_num_seqs, num_blocks, max_model_len=max_model_len, kv_dtype=kv_dtype,
                                 context=context), config)
    with BackgroundServer(app, request_read_timeout=config.request_read_timeout, max_connections=config.max_connections) as server:
        yield server


@contextlib.contextmanager
def serve_tiny_model_process(*options: str):
    """`ridgeline serve` on the tiny model in a process of its own (one a test can signal or kill): (process, url).
    Its stderr stays readable through process.stderr."""
    command = [sys.executable, "-c", "from ridgeline.cli import main; main()", "serve", str(tiny_model_path()),
               "--port", "0", "--kv-cache-memory", "10MiB", "--kv-cache-dtype", "fp32", *options]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        url, deadline = None, time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line and process.poll() is not None:
                break
            if match := re.search(r"Uvicorn running on (http://[\d.]+:\d+)", line):
                url = match.group(1)
        assert url, "the server did not start"
        yield process, url
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
