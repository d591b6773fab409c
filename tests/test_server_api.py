"""The OpenAI-compatible API end to end: a real server on a loopback port, driven by the official `openai` client."""

import httpx
import jinja2
import pytest

from server_helpers import CHAT_TEMPLATE

PROMPT = "The quick brown fox jumps over the lazy dog"
GREEDY = {"temperature": 0.0}


@pytest.fixture(scope="module")
def model(client) -> str:
    return client.models.list().data[0].id


def tokenize(server, text: str) -> list[int]:
    return httpx.post(f"{server.url}/tokenize", json={"prompt": text}).json()["tokens"]


def test_completion_counts_its_tokens(client, model, server):
    response = client.completions.create(model=model, prompt=PROMPT, max_tokens=7, extra_body={"ignore_eos": True})
    (choice,) = response.choices
    assert choice.finish_reason == "length" and choice.index == 0 and choice.text
    assert response.object == "text_completion" and response.model == model
    assert response.usage.prompt_tokens == len(tokenize(server, PROMPT))
    assert response.usage.completion_tokens == 7
    assert response.usage.total_tokens == response.usage.prompt_tokens + 7


def test_streamed_completion_equals_the_whole_one(client, model):
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, **GREEDY)
    chunks = list(
        client.completions.create(
            model=model, prompt=PROMPT, max_tokens=12, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    *content, usage_chunk = chunks
    assert "".join(c.choices[0].text for c in content) == whole.choices[0].text
    assert content[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens == whole.usage.completion_tokens


def test_chat_streamed_and_whole_agree(client, model):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(model=model, messages=messages, max_completion_tokens=10, **GREEDY)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(
            model=model, messages=messages, max_tokens=10, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_n_choices(client, model, server):
    response = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=6, n=3, seed=5, temperature=1.0, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in response.choices) == [0, 1, 2]
    assert response.usage.prompt_tokens == len(tokenize(server, PROMPT))  # the prompt is billed once
    assert response.usage.completion_tokens == 3 * 6
    streamed = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=5, n=2, stream=True, temperature=1.0
    )
    finished = {c.choices[0].index for c in streamed if c.choices and c.choices[0].finish_reason}
    assert finished == {0, 1}


def test_several_prompts_in_one_request(client, model):
    response = client.completions.create(model=model, prompt=[PROMPT, "Once upon a time"], max_tokens=4, n=2, **GREEDY)
    assert [c.index for c in sorted(response.choices, key=lambda c: c.index)] == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in response.choices}
    assert by_index[0] == by_index[1] and by_index[2] == by_index[3]  # greedy: both samples of a prompt agree


def test_stop_string_ends_the_text_before_it(client, model):
    full = client.completions.create(model=model, prompt=PROMPT, max_tokens=24, extra_body={"ignore_eos": True}, **GREEDY)
    text = full.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), f"pick another prompt: no usable stop string in {text!r}"
    stopped = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=24, stop=[stop], extra_body={"ignore_eos": True}, **GREEDY
    )
    assert stopped.choices[0].text == text[: text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=24, stop=stop, stream=True, extra_body={"ignore_eos": True}, **GREEDY
    )
    assert "".join(c.choices[0].text for c in streamed) == text[: text.index(stop)]


def test_seeded_sampling_is_reproducible(client, model):
    def sample(seed: int) -> str:
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text

    assert sample(1234) == sample(1234)
    assert sample(1234) != sample(4321)


def test_cached_tokens_are_reported_for_a_repeated_prompt(client, model, server):
    prompt = "A prompt long enough to fill several cache blocks: " + " ".join(f"w{i}" for i in range(60))
    first = client.completions.create(model=model, prompt=prompt, max_tokens=2)
    second = client.completions.create(model=model, prompt=prompt, max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    assert cached % 16 == 0  # whole blocks only


def test_echo_with_logprobs_scores_the_prompt(client, model, server):
    ids = tokenize(server, PROMPT)
    response = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, echo=True, logprobs=2, **GREEDY)
    (choice,) = response.choices
    logprobs = choice.logprobs
    assert choice.text.startswith(PROMPT)
    assert len(logprobs.tokens) == len(ids) + 1
    assert logprobs.token_logprobs[0] is None  # the first token has nothing to be predicted from
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert all(len(top) <= 2 for top in logprobs.top_logprobs[1:])
    assert logprobs.text_offset == sorted(logprobs.text_offset)
    generated = logprobs.token_logprobs[-1]
    assert generated == pytest.approx(max(logprobs.top_logprobs[-1].values()))  # greedy took the top token

    scored_only = client.completions.create(model=model, prompt=PROMPT, max_tokens=0, echo=True, logprobs=0)
    assert scored_only.choices[0].text == PROMPT
    assert scored_only.choices[0].logprobs.token_logprobs == pytest.approx(logprobs.token_logprobs[:-1])
    assert scored_only.usage.completion_tokens == 0


def test_chat_logprobs(client, model):
    response = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=4, logprobs=True, top_logprobs=3,
        **GREEDY,
    )
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert bytes(entry.bytes).decode("utf-8", errors="replace") == entry.token


def test_vllm_extras_and_harmless_unknown_fields_are_accepted(client, model):
    response = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=3,
        user="someone",
        extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1, "stop_token_ids": [0], "store": True,
                    "metadata": {"a": "b"}, "some_future_field": 1},
    )
    assert response.choices[0].finish_reason in ("stop", "length")


def test_models_health_tokenize_detokenize(server, model):
    assert httpx.get(f"{server.url}/health").status_code == 200
    cards = httpx.get(f"{server.url}/v1/models").json()
    assert cards["object"] == "list" and cards["data"][0]["id"] == model
    ids = tokenize(server, PROMPT)
    assert httpx.post(f"{server.url}/detokenize", json={"tokens": ids}).json()["prompt"] == PROMPT
    chat_ids = httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": PROMPT}]}).json()
    assert chat_ids["count"] == len(chat_ids["tokens"]) > len(ids)


def test_tokenizer_info_is_what_a_remote_tokenizer_needs(server):
    """lm-eval's tokenizer_backend=remote reads the special tokens and chat template here, and tokenizes through
    /tokenize: the served tokenizer, with no tokenizer files on the client."""
    info = httpx.get(f"{server.url}/tokenizer_info").json()
    assert info["tokenizer_class"] == "HfTokenizer"
    assert (info["bos_token"], info["eos_token"], info["add_bos_token"]) == ("<s>", "</s>", True)
    assert info["chat_template"] == CHAT_TEMPLATE
    assert info["model_max_length"] == httpx.get(f"{server.url}/v1/models").json()["data"][0]["max_model_len"]
    rendered = jinja2.Template(info["chat_template"]).render(messages=[{"role": "user", "content": PROMPT}],
                                                             add_generation_prompt=True)
    served = httpx.post(f"{server.url}/tokenize", json={"messages": [{"role": "user", "content": PROMPT}]}).json()
    decoded = httpx.post(f"{server.url}/detokenize", json={"tokens": served["tokens"]}).json()["prompt"]
    assert decoded == rendered.replace("<|end|>", "")  # the client renders what chat requests get (less specials)


def test_metrics_count_what_was_served(server, client, model):
    def scrape() -> dict[str, float]:
        lines = httpx.get(f"{server.url}/metrics").text.splitlines()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if not line.startswith("#")}

    before = scrape()
    client.completions.create(model=model, prompt=PROMPT, max_tokens=5, extra_body={"ignore_eos": True})
    after = scrape()
    label = f'{{model_name="{model}"}}'

    def grew(name: str) -> float:
        return after[name + label] - before.get(name + label, 0.0)

    assert grew("ridgeline_generation_tokens_total") == 5
    assert grew("ridgeline_prompt_tokens_total") == len(tokenize(server, PROMPT))
    assert grew("ridgeline_time_to_first_token_seconds_count") == 1
    assert grew("ridgeline_inter_token_latency_seconds_count") == 4
    assert grew("ridgeline_e2e_request_latency_seconds_count") == 1
    assert after[f'ridgeline_request_success_total{{finished_reason="length",model_name="{model}"}}'] >= 1
    for gauge in ("ridgeline_num_requests_running", "ridgeline_num_requests_waiting", "ridgeline_kv_cache_usage_perc",
                  "ridgeline_prefix_cache_hit_rate"):
        assert gauge + label in after
