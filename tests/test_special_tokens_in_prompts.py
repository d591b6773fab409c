"""Special-token text in a text prompt is the special token, as Hugging Face tokenizers, vLLM and llama.cpp's
parse_special read it: "<bos>" through /tokenize is BOS (lm-eval's tokenizer_backend=remote builds its requests
so), a hand-written chat turn in /v1/completions is the chat endpoint's tokens. `split_special_tokens` keeps such
text plain; a token-id prompt is taken as it is. Each tokenizer kind: the default model's GGUF SentencePiece
vocabulary (Gemma), a GGUF byte-level BPE (the tiny server model) and a tokenizer.json directory."""

import json

import httpx
import pytest

from ridgeline.engine.admission import Admission, AdmissionLimits
from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.model.tokenizer import tokenizer_from_hf_dir
from ridgeline.server.app import ServerConfig, create_app
from ridgeline.server.launcher import BackgroundServer
from tiny_models import save_tokenizer

GEMMA_TURN = "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"


def _admission(tokenizer) -> Admission:
    return Admission(AdmissionLimits(tokenizer.vocab_size, 4096, 4096, True), tokenizer)


# ---------------------------------------------------------------- the default model (Gemma, GGUF SentencePiece)


@pytest.fixture(scope="module")
def gemma_server():
    engine = LLMEngine(EngineConfig(kv_cache=KVCacheConfig(memory_bytes=16 << 20)))
    with BackgroundServer(create_app(engine, ServerConfig(served_model_name="gemma"))) as server:
        yield server


def test_bos_text_through_tokenize_is_bos_on_the_default_model(gemma_server):
    tokenize = lambda **body: httpx.post(f"{gemma_server.url}/tokenize", json=body).json()["tokens"]
    info = httpx.get(f"{gemma_server.url}/tokenizer_info").json()
    assert info["bos_token"] == "<bos>"
    # What lm-eval's remote tokenizer does with the bos_token /tokenizer_info names.
    assert tokenize(prompt=info["bos_token"], add_special_tokens=False) == [2]
    assert tokenize(prompt="<bos>hi", add_special_tokens=False) == [2, *tokenize(prompt="hi", add_special_tokens=False)]
    # The opt-out: the text as plain text, "<", "bos", ">".
    assert len(tokenize(prompt="<bos>", add_special_tokens=False, split_special_tokens=True)) == 3


def test_a_hand_written_gemma_turn_is_the_chat_endpoints_prompt(gemma_server):
    chat_ids = httpx.post(f"{gemma_server.url}/tokenize",
                          json={"messages": [{"role": "user", "content": "hi"}]}).json()["tokens"]
    text_ids = httpx.post(f"{gemma_server.url}/tokenize", json={"prompt": GEMMA_TURN}).json()["tokens"]
    assert text_ids == chat_ids
    assert text_ids[:3] == [2, 105, 2364]  # BOS, <start_of_turn>, "user"
    # The completion endpoint tokenizes its prompt the same way: its usage counts the chat prompt's tokens, and
    # greedy, it answers what the chat endpoint answers.
    body = {"max_tokens": 4, "temperature": 0}
    completion = httpx.post(f"{gemma_server.url}/v1/completions", json={"prompt": GEMMA_TURN, **body}).json()
    chat = httpx.post(f"{gemma_server.url}/v1/chat/completions",
                      json={"messages": [{"role": "user", "content": "hi"}], **body}).json()
    assert completion["usage"]["prompt_tokens"] == chat["usage"]["prompt_tokens"] == len(chat_ids)
    assert completion["choices"][0]["text"] == chat["choices"][0]["message"]["content"]
    split = httpx.post(f"{gemma_server.url}/v1/completions",
                       json={"prompt": GEMMA_TURN, "split_special_tokens": True, **body}).json()
    assert split["usage"]["prompt_tokens"] > len(chat_ids) + 10  # each "<start_of_turn>" as several tokens


def test_offline_text_prompts_parse_special_tokens_too(default_tokenizer):
    admission = _admission(default_tokenizer)
    assert admission.prompt_ids("<start_of_turn>user\nhi")[:3] == [2, 105, 2364]
    assert admission.prompt_ids([2, 105, 2364]) == [2, 105, 2364]  # ids untouched
    assert len(admission.prompt_ids("<start_of_turn>user\nhi", special=False)) > 5


# ---------------------------------------------------------------- byte-level BPE: GGUF (tiny server) and tokenizer.json


def test_tiny_server_parses_special_text_in_completions_and_tokenize(server):
    tokenize = lambda **body: httpx.post(f"{server.url}/tokenize", json=body).json()["tokens"]
    # The tiny model: <s> is 0 (BOS), </s> 1, <|end|> 2, all control tokens.
    assert tokenize(prompt="<s>", add_special_tokens=False) == [0]
    assert tokenize(prompt="fox<|end|>dog", add_special_tokens=False) == [
        *tokenize(prompt="fox", add_special_tokens=False), 2, *tokenize(prompt="dog", add_special_tokens=False)]
    assert 2 not in tokenize(prompt="fox<|end|>dog", add_special_tokens=False, split_special_tokens=True)
    completion = lambda **body: httpx.post(f"{server.url}/v1/completions",
                                           json={"max_tokens": 1, "echo": True, "logprobs": 0, **body}).json()
    parsed = completion(prompt="fox<|end|>dog")["choices"][0]["logprobs"]["tokens"]
    assert "<|end|>" in parsed
    assert "<|end|>" not in completion(prompt="fox<|end|>dog", split_special_tokens=True)["choices"][0]["logprobs"]["tokens"]
    ids = tokenize(prompt="fox<|end|>dog", split_special_tokens=True)
    # A token-id prompt is run as given (its ids are never re-read as text).
    assert completion(prompt=ids)["usage"]["prompt_tokens"] == len(ids)


def test_tokenizer_json_directory_parses_special_text(tmp_path):
    save_tokenizer(tmp_path)
    tokenizer = tokenizer_from_hf_dir(tmp_path)
    admission = _admission(tokenizer)
    assert admission.prompt_ids("the fox</s>") == [*tokenizer.encode("the fox"), 1]
    assert 1 not in admission.prompt_ids("the fox</s>", special=False)
    # A tokenizer_config.json that asks to split special tokens (Hugging Face's option) keeps them plain text.
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "split_special_tokens": True}))
    splitting = tokenizer_from_hf_dir(tmp_path)
    assert splitting.split_special_tokens
    assert 1 not in _admission(splitting).prompt_ids("the fox</s>")
