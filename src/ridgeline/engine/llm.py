"""Offline API: `LLM(model).generate(prompts, params)`, the way vLLM users expect it."""

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import replace

from tqdm import tqdm

from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.outputs import RequestOutput
from ridgeline.engine.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, config: EngineConfig | None = None, max_model_len: int | None = None,
                 kv_cache_dtype: str | None = None):
        config = config or EngineConfig()
        if model is not None:
            config = replace(config, model=model)
        if max_model_len is not None:
            config = replace(config, max_model_len=max_model_len)
        if kv_cache_dtype is not None:  # as vLLM's LLM(kv_cache_dtype=...): K and V both
            config = replace(config, kv_cache=replace(config.kv_cache, dtype=kv_cache_dtype))
        self.engine = LLMEngine(config)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Final outputs in prompt order; a prompt with n > 1 gives its n samples one after another (its prompt
        is prefilled once: the other samples fork the first)."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        per_prompt = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        order = []
        for prompt, prompt_params in zip(prompts, per_prompt, strict=True):
            first = None
            for index in range(prompt_params.n):
                request_id = str(next(self._ids))
                self.engine.add_request(request_id, prompt, prompt_params.child(index), fork_of=first)
                first = first or request_id
                order.append(request_id)
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(order), desc="generating", unit="req", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished():
                for output in self.engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
        return [finished[request_id] for request_id in order]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """One request, yielding an output after every step that produced something for it."""
        request_id = str(next(self._ids))
        self.engine.add_request(request_id, prompt, params or SamplingParams())
        try:
            while True:
                for output in self.engine.step():
                    if output.request_id == request_id:
                        yield output
                        if output.finished:
                            return
        finally:
            self.engine.abort(request_id)
