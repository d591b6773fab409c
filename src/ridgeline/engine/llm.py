"""Offline API: `LLM(model).generate(prompts, params)` and `.chat(messages, params, tools=...)`, the way vLLM users
expect them."""

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

from tqdm import tqdm

from ridgeline.engine.llm_engine import EngineConfig, LLMEngine
from ridgeline.engine.outputs import RequestOutput
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.structured import StructuredOutputsParams
from ridgeline.tool_calls import FunctionTool, ToolCall, Toolset

Prompt = str | list[int]
Messages = list[dict]


@dataclass
class ChatOutput(RequestOutput):
    """A chat answer: the request's output, and its text read for tool calls (`content` None when it is only
    calls; `finish_reason` "tool_calls" when it ended in calls, as OpenAI's)."""

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)


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
                 use_tqdm: bool = True, priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Final outputs in prompt order; a prompt with n > 1 gives its n samples one after another (its prompt
        is prefilled once: the other samples fork the first). `priority`: one per prompt, as vLLM takes it (lower
        is served first); it replaces the params' own priority."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params or SamplingParams()
        per_prompt = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
        if priority is not None:
            per_prompt = [replace(p, priority=value) for p, value in zip(per_prompt, priority, strict=True)]
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

    def chat(self, messages: Messages | Sequence[Messages], params: SamplingParams | None = None,
             tools: Sequence[dict | FunctionTool] | None = None, tool_choice: str | dict | None = None,
             parallel_tool_calls: bool = True, add_generation_prompt: bool = True,
             use_tqdm: bool = True) -> list[ChatOutput]:
        """Answers to one conversation or several, rendered by the model's chat template. `tools` are OpenAI
        function definitions (or FunctionTool); `tool_choice` "auto" (the default with tools), "none", "required"
        or {"type": "function", "function": {"name": ...}} — a forced call is valid by grammar, as on the server."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        toolset = Toolset.from_openai(tools or [], tool_choice, parallel_tool_calls)
        params = params or SamplingParams()
        answer_schema = None
        asked = params.structured_outputs
        if asked is not None and (asked.json is not None or asked.json_object):
            answer_schema = {"type": "object"} if asked.json_object else asked.json
        grammar = toolset.grammar(answer_schema if isinstance(answer_schema, dict) else None)
        if grammar is not None:
            params = replace(params, structured_outputs=StructuredOutputsParams(grammar=grammar, source="tool_choice"))
        prompts = []
        for conversation in conversations:
            shown, template_tools = toolset.template_input(list(conversation), self.tokenizer.effective_chat_template)
            text = self.tokenizer.apply_chat_template(shown, add_generation_prompt, tools=template_tools)
            prompts.append(self.tokenizer.encode(text, special=True))
        answers = []
        for output in self.generate(prompts, params, use_tqdm=use_tqdm):
            content, calls = toolset.read(output.text)
            finish_reason = "tool_calls" if calls and output.finish_reason == "stop" else output.finish_reason
            answers.append(ChatOutput(**{**vars(output), "finish_reason": finish_reason}, content=content,
                                      tool_calls=calls))
        return answers

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
