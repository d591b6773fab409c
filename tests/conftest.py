"""Fixtures shared across the suite: the real default model (loaded once per weight format) and tiny random models."""

import pytest
import torch
from compiled_kernels import build_failed, cpu_line, kernel_paths_line

torch.set_num_threads(2)


def pytest_report_header(config):
    return cpu_line()


def pytest_sessionstart(session):
    # Build the compiled kernels (minutes on a fresh 2-core AVX2 machine) before any test runs: otherwise the first
    # test to reach them, maybe a server test whose clients wait 60 s for a token, pays for the whole build. Only in
    # the controlling process: a failed build is reported by the tests that need the kernels and at the end.
    from ridgeline.model import native

    if native.kernel_target() is not None:
        native.compiled()


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(kernel_paths_line())


def pytest_sessionfinish(session):
    if build_failed():  # even where no test asked through needs_compiled, a CPU that can run them must have them
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def default_checkpoint():
    from ridgeline.model.checkpoint import read_checkpoint

    return read_checkpoint()


@pytest.fixture(scope="session")
def default_tokenizer(default_checkpoint):
    """The default model's tokenizer as the engine builds it: from the GGUF metadata the checkpoint keeps (cached
    after the first parse; test_tokenizer checks it tokenizes as the file parsed again does). Parsing the file
    again with gguf.GGUFReader takes ~13 s here, for its 262,144-token vocabulary."""
    return default_checkpoint.load_tokenizer()


def make_runner(checkpoint, weights: str, num_blocks: int = 64):
    from ridgeline.engine.assemble import assemble_model
    from ridgeline.engine.kv_cache import KVCacheConfig
    from ridgeline.model.transformer import ModelOptions

    return assemble_model(checkpoint, ModelOptions(weights=weights), KVCacheConfig(dtype="fp32"), num_blocks=num_blocks).runner


@pytest.fixture(scope="session")
def default_runner(default_checkpoint):
    """The default model as the engine runs it: weights kept quantised, phase-aware kernels."""
    return make_runner(default_checkpoint, "quantized")


@pytest.fixture(scope="module")
def server():
    """A real server on the tiny model, on a loopback port, for the tests of one module (a module may define its own)."""
    from server_helpers import serve_tiny_model

    with serve_tiny_model() as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    """The official `openai` client pointed at `server`."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="session")
def tiny_hf_llama(tmp_path_factory):
    """A random 2-layer llama as a Hugging Face directory with a tokenizer (tests/tiny_models.py): read-only."""
    from tiny_models import build_hf_model, save_tokenizer

    directory = tmp_path_factory.mktemp("tiny-hf-llama")
    build_hf_model("llama", directory)
    save_tokenizer(directory)
    return directory
