"""logit_bias as OpenAI defines it, through the real server and the official client: +100 forces a token, -100
bans one, in greedy and sampled requests alike."""

import httpx
import pytest

PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_bias_of_plus_100_forces_the_token(server, client, temperature: float) -> None:
    forced, model = 42, client.models.list().data[0].id
    biased = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=temperature, seed=3,
                                       logit_bias={str(forced): 100}, extra_body={"ignore_eos": True})
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=6, temperature=temperature, seed=3,
                                      extra_body={"ignore_eos": True})
    expected = httpx.post(f"{server.url}/detokenize", json={"tokens": [forced] * 6}).json()["prompt"]
    assert biased.choices[0].text == expected != plain.choices[0].text


def test_a_bias_of_minus_100_bans_the_greedy_choice(server, client) -> None:
    model, messages = client.models.list().data[0].id, [{"role": "user", "content": PROMPT}]
    greedy = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0,
                                            logprobs=True, extra_body={"ignore_eos": True})
    first = greedy.choices[0].logprobs.content[0].token
    (first_id,) = httpx.post(f"{server.url}/tokenize", json={"prompt": first, "add_special_tokens": False}).json()["tokens"]
    banned = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True,
                                            logit_bias={str(first_id): -100}, extra_body={"ignore_eos": True})
    tokens = [entry.token for entry in banned.choices[0].logprobs.content]
    assert first not in tokens
