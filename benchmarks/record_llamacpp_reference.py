"""Record llama.cpp's outputs on a model as test oracles (tests/data/reference/), run inside the llama.cpp venv.

    benchmarks/.venv-llamacpp/bin/python benchmarks/record_llamacpp_reference.py MODEL.gguf TEXT.txt OUT.json

Writes the same shape of JSON as the default model's reference (tests/data/reference/README.md): `tokenize`,
`greedy` (prompt ids, 32 greedy steps, per step the argmax, top-5 logits and the top-1 margin), `chat` cases
(messages, the prompt llama-cpp-python's Jinja formatter renders from the file's template, its ids and greedy
continuation) and `perplexity` as `llama-perplexity -c 512 -b 512` computes it: non-overlapping 512-token
windows, BOS in each window's first slot where the vocabulary adds one, each scored on its second half (with each
window's summed negative log-likelihood, so a test can score a few windows instead of the whole text).
"""

import json
import math
import sys

import llama_cpp
import numpy as np
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

CTX = 512
STEPS = 32
PROMPTS = [
    "The capital of France is",
    "Once upon a time, there was a little robot who",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "The three primary colors are",
    "In 1969, Neil Armstrong became the first person to",
]
TOKENIZE = ["Hello world", " leading space", "naïve café — ünïcödé", "1234567890", "a\n\nb\tc", "<|im_start|>user"]
CHATS = [  # with a system turn, and without one (as `ridgeline generate --chat` sends a prompt: the template adds its own)
    [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "What is the capital of France?"}],
]


def main(model: str, text_path: str, out_path: str) -> None:
    llm = llama_cpp.Llama(model_path=model, n_ctx=CTX, n_batch=CTX, n_ubatch=CTX, n_threads=2, n_threads_batch=2,
                          logits_all=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
    bos = llm.token_bos()

    def tokens(text: str, special: bool) -> list[int]:
        return llm.tokenize(text.encode(), add_bos=add_bos, special=special)

    def greedy(prompt_ids: list[int]) -> dict:
        llm.reset()
        llm.eval(prompt_ids)
        generated, trace = [], []
        for _ in range(STEPS):
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            top = np.argsort(-logits)[:5]
            token = int(top[0])
            trace.append({"id": token, "top": [[int(t), round(float(logits[t]), 4)] for t in top],
                          "margin": round(float(logits[top[0]] - logits[top[1]]), 4)})
            generated.append(token)
            if llm.token_eos() == token:
                break
            llm.eval([token])
        return {"prompt_ids": prompt_ids, "generated_ids": generated,
                "generated_text": llm.detokenize(generated).decode(errors="replace"), "trace": trace}

    record = {
        "llama_cpp_python": llama_cpp.__version__,
        "add_bos": add_bos,
        "tokenize": [{"text": t, "ids": tokens(t, s), "special": s} for t in TOKENIZE for s in (False, True)],
        "greedy": [{"prompt": p, "special": False} | greedy(tokens(p, False)) for p in PROMPTS],
    }
    template = llm.metadata["tokenizer.chat_template"]
    formatter = Jinja2ChatFormatter(template, eos_token=llm.detokenize([llm.token_eos()]).decode(),
                                    bos_token=llm.detokenize([bos]).decode())
    record["chat"] = []
    for messages in CHATS:
        prompt = formatter(messages=messages).prompt
        record["chat"].append({"messages": messages, "prompt": prompt} | greedy(tokens(prompt, True)))

    ids = tokens(open(text_path, encoding="utf-8").read(), False)
    nll, window_nll = [], []
    for w in range(len(ids) // CTX):
        window = ids[w * CTX:(w + 1) * CTX]
        if add_bos:
            window[0] = bos
        llm.reset()
        llm.eval(window)
        logits = np.asarray(llm.scores[:CTX], dtype=np.float64)
        for j in range(CTX // 2, CTX - 1):
            row = logits[j]
            peak = row.max()
            nll.append(peak + math.log(np.exp(row - peak).sum()) - row[window[j + 1]])
        window_nll.append(round(float(sum(nll[-(CTX // 2 - 1):])), 4))
    mean = float(np.mean(nll))
    record["perplexity"] = {"ctx": CTX, "windows": len(ids) // CTX, "scored_tokens": len(nll),
                            "ppl": round(math.exp(mean), 4), "text_tokens": len(ids), "window_nll": window_nll}
    with open(out_path, "w") as out:
        json.dump(record, out, indent=1)
        out.write("\n")
    print(json.dumps(record["perplexity"]))


if __name__ == "__main__":
    main(*sys.argv[1:4])
