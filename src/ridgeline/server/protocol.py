"""Request and response bodies of the OpenAI-compatible API, with OpenAI's field names and vLLM's sampling extras.

Unknown fields are ignored (clients send many harmless ones); fields we know but do not implement are
declared here only so that a request using them gets a 400 naming the field instead of a silent no-op.
Types are strict: a string where a number belongs is an error, not a guess. Value ranges of sampling
fields are checked once, by `SamplingParams.validate()`, not here.
"""

import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ridgeline.model.tokenizer.valid_text import first_invalid


class RequestModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    @field_validator("*", mode="before")
    @classmethod
    def _valid_unicode(cls, value: Any) -> Any:
        # JSON may spell a lone surrogate ("\ud800"); refused here so the 400 names the field (see valid_text.py).
        problem = first_invalid(value)
        if problem:
            raise ValueError(problem)
        return value


def _is_unset(value: Any) -> bool:
    return value is None or value == [] or value == {} or value == ""


def _reject_if_set(value: Any, field_name: str) -> Any:
    if not _is_unset(value):
        raise ValueError(f"'{field_name}' is not supported by this server")
    return value


class StreamOptions(RequestModel):
    include_usage: bool = False


class JSONSchemaFormat(RequestModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_json_schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format of type 'json_schema' needs a 'json_schema' object")
        return self


class SamplingFields(RequestModel):
    """Fields shared by completions and chat: OpenAI's sampling knobs plus vLLM's extras."""

    model: str | None = None  # None: the one model this server serves
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM extras
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    priority: int = 0  # lower is served first (docs/priority_scheduling.md); range checked by SamplingParams
    # Disaggregated prefill/decode, as vLLM's P/D connectors name it (server/disaggregation.py)
    kv_transfer_params: dict[str, Any] | None = None
    # Structured outputs (engine/structured/): OpenAI's response_format, vLLM's structured_outputs object, and the
    # guided_* fields older vLLM releases took (still sent by many clients). server/structured.py reads them.
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None

    @model_validator(mode="after")
    def _usage_options_need_stream(self) -> "SamplingFields":
        if self.stream_options is not None and not self.stream:
            raise ValueError("'stream_options' is only allowed when 'stream' is true")
        return self



PromptField = (
    str
    | Annotated[list[str], Field(min_length=1)]
    | Annotated[list[int], Field(min_length=1)]
    | Annotated[list[Annotated[list[int], Field(min_length=1)]], Field(min_length=1)]
)


# Special-token text in a text prompt ("<bos>", "<start_of_turn>") is the special token, as Hugging Face tokenizers,
# vLLM and llama-server read it; true keeps it plain text (the Hugging Face tokenizer option of this name). A
# token-id prompt is taken as it is either way.
SPLIT_SPECIAL_TOKENS_DEFAULT = False


class CompletionRequest(SamplingFields):
    prompt: PromptField
    split_special_tokens: bool = SPLIT_SPECIAL_TOKENS_DEFAULT
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: Any) -> Any:
        return _reject_if_set(value, "suffix")

    @model_validator(mode="after")
    def _best_of_is_n(self) -> "CompletionRequest":
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("'best_of' different from 'n' is not supported by this server")
        return self

    def prompts(self) -> list[str | list[int]]:
        """The batch of prompts: a string, a list of strings, a token list, or a list of token lists."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)


class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class FunctionCallIn(RequestModel):
    name: str
    arguments: str = "{}"  # JSON text, as OpenAI sends it


class ToolCallIn(RequestModel):
    """A call an earlier assistant turn made, sent back in the history."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant turn's calls
    tool_call_id: str | None = None  # a tool turn's: the call it answers

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def for_template(self) -> dict:
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            message["name"] = self.name
        return message


class FunctionDefinition(RequestModel):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


class KVReleaseRequest(RequestModel):
    request_id: str


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True  # vLLM extra
    # Tool calling (ridgeline/tool_calls): OpenAI's fields.
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # Known OpenAI features this server does not implement: present only to be refused by name.
    functions: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None

    @field_validator("functions", "function_call", "audio", "prediction", "web_search_options")
    @classmethod
    def _unsupported(cls, value: Any, info) -> Any:
        return _reject_if_set(value, info.field_name)

    @field_validator("modalities")
    @classmethod
    def _text_modality_only(cls, value: list[str] | None) -> list[str] | None:
        if value not in (None, [], ["text"]):
            raise ValueError("'modalities' other than ['text'] are not supported by this server")
        return value

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("'top_logprobs' requires 'logprobs' to be true")
        return self

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(RequestModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True  # BOS, where the model wants one
    add_generation_prompt: bool = True
    split_special_tokens: bool = SPLIT_SPECIAL_TOKENS_DEFAULT
    # A chat request's tools change its prompt (the template shows them): tokenized as that request would be.
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of 'prompt' or 'messages'")
        return self


class KVLookupRequest(TokenizeRequest):
    """A front's question to a decode worker (POST /v1/kv/lookup): how much of this prompt's KV do you hold? The
    prompt as a completion or chat request gives it, so it is tokenized exactly as that request would be."""

    prompt: str | list[int] | None = None


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[int]


# ---------------------------------------------------------------- responses


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)

    def add(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.total_tokens = self.prompt_tokens + self.completion_tokens
        self.prompt_tokens_details.cached_tokens += cached_tokens


class CompletionLogprobs(BaseModel):
    """The legacy completions format: parallel lists, one entry per token (prompt tokens too when echoing)."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    kv_transfer_params: dict[str, Any] | None = None  # a prefill worker's: where a decode worker pulls the KV


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCallOut] = Field(default_factory=list)


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage
    kv_transfer_params: dict[str, Any] | None = None  # a prefill worker's: where a decode worker pulls the KV


class FunctionCallDelta(BaseModel):
    name: str | None = None
    arguments: str | None = None


class ToolCallChunk(BaseModel):
    """A piece of a streamed call, in OpenAI's delta shape: id, type and name on a call's first piece only."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallChunk] | None = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "ridgeline"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
