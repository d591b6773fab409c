"""pp/tg timing of llama.cpp through llama-cpp-python; run by bench_vs_llamacpp.py inside the llama.cpp venv.

Prints one JSON object: {"pp_tok_s": [...], "tg_tok_s": [...]}. Same protocol as ridgeline's bench latency:
pp = one pass over a prompt of random token ids; tg = one-token passes from an empty cache.
"""

import json
import random
import sys
import time

import llama_cpp


def main(model: str, prompt_tokens: int, gen_tokens: int, threads: int, repetitions: int) -> None:
    llm = llama_cpp.Llama(model_path=model, n_threads=threads, n_threads_batch=threads, n_ctx=prompt_tokens + gen_tokens + 16,
                          n_batch=max(prompt_tokens, 1), n_ubatch=max(prompt_tokens, 1), verbose=False)
    rng = random.Random(0)
    prompt = [rng.randrange(llm.n_vocab()) for _ in range(prompt_tokens)]
    generated = [rng.randrange(llm.n_vocab()) for _ in range(gen_tokens)]

    def timed(tokens_per_call: list[list[int]]) -> float:
        llm.reset()  # n_past = 0; eval drops the cache entries past it
        start = time.perf_counter()
        for tokens in tokens_per_call:
            llm.eval(tokens)
        return time.perf_counter() - start

    timed([prompt[:32]])
    pp, tg = [], []
    for _ in range(repetitions):
        if prompt_tokens:
            pp.append(prompt_tokens / timed([prompt]))
        if gen_tokens:
            tg.append(gen_tokens / timed([[t] for t in generated]))
    print(json.dumps({"pp_tok_s": pp, "tg_tok_s": tg, "llama_cpp_python": llama_cpp.__version__}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
