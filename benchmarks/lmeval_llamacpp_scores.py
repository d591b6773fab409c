"""llama.cpp's log-likelihood of each (context, continuation) pair, as lm-eval's API models score them; run by
lmeval_remote.py --compare-llamacpp inside the llama.cpp venv.

Reads {"model": path, "threads": n, "pairs": [[context, continuation], ...], "bos": false} on stdin and prints one JSON object:
{"scores": [{"context_ids", "continuation_ids", "loglik", "is_greedy"}, ...], "llama_cpp_python": version}.
The pair is tokenized as lm-eval does for a causal model (lm_eval/api/model.py `_encode_pair`: trailing spaces of
the context move to the continuation; the whole text is encoded and the context's length split off) with
llama.cpp's own tokenizer and no BOS (lm-eval's remote tokenizer asks /tokenize for add_special_tokens=false, and
sends the ids as they are); the continuation's log-likelihood is the sum of its tokens' log-softmax.
"""

import json
import sys

import llama_cpp
import numpy as np


def encode_pair(llm, context: str, continuation: str) -> tuple[list[int], list[int]]:
    spaces = len(context) - len(context.rstrip())
    if spaces:
        continuation, context = context[-spaces:] + continuation, context[:-spaces]

    def encode(text: str) -> list[int]:
        return llm.tokenize(text.encode(), add_bos=False, special=True)

    whole, head = encode(context + continuation), encode(context)
    return head, whole[len(head):]


def log_softmax(row: np.ndarray) -> np.ndarray:
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def main() -> None:
    job = json.load(sys.stdin)
    llm = llama_cpp.Llama(model_path=job["model"], n_threads=job["threads"], n_threads_batch=job["threads"],
                          n_ctx=512, n_batch=512, n_ubatch=512, logits_all=True, verbose=False)
    scores = []
    for context, continuation in job["pairs"]:
        head, tail = encode_pair(llm, context, continuation)
        if job.get("bos"):  # the check beside lm-eval's: the same pair after the model's BOS
            head = [llm.token_bos()] + head
        tokens = head + tail
        llm.reset()
        llm.eval(tokens)
        logits = np.asarray(llm.scores[:len(tokens)], dtype=np.float64)
        total, greedy = 0.0, True
        for position in range(len(head), len(tokens)):  # the logits of position - 1 predict token `position`
            row = log_softmax(logits[position - 1])
            total += float(row[tokens[position]])
            greedy = greedy and int(row.argmax()) == tokens[position]
        scores.append({"context_ids": head, "continuation_ids": tail, "loglik": total, "is_greedy": greedy})
    print(json.dumps({"scores": scores, "llama_cpp_python": llama_cpp.__version__}))


if __name__ == "__main__":
    main()
