"""The offline API's chat with tools (`LLM.chat(..., tools=...)`): a forced call is a valid call, as on the server,
and the answer comes back read for calls; a JSON schema holds through SamplingParams.structured_outputs."""

import json

import jsonschema
from server_helpers import tiny_model_path

from ridgeline.engine.kv_cache import KVCacheConfig
from ridgeline.engine.llm import LLM
from ridgeline.engine.llm_engine import EngineConfig
from ridgeline.engine.sampling_params import SamplingParams
from ridgeline.engine.structured import StructuredOutputsParams

PARAMETERS = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}, "days": {"enum": [1, 2, 3]}},
              "required": ["city", "days"]}
TOOLS = [{"type": "function", "function": {"name": "forecast", "parameters": PARAMETERS}}]


def test_chat_with_a_required_tool_answers_with_valid_calls():
    llm = LLM(config=EngineConfig(model=str(tiny_model_path(2048)), kv_cache=KVCacheConfig(memory_bytes=8 << 20)))
    conversations = [[{"role": "user", "content": "Weather in Oslo?"}], [{"role": "user", "content": "And Paris?"}]]
    outputs = llm.chat(conversations, SamplingParams(temperature=0, max_tokens=200), tools=TOOLS,
                       tool_choice="required", parallel_tool_calls=False, use_tqdm=False)
    for output in outputs:
        assert output.finish_reason == "tool_calls" and output.content is None
        (call,) = output.tool_calls
        assert call.name == "forecast"
        jsonschema.validate(json.loads(call.arguments), PARAMETERS)

    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    params = SamplingParams(temperature=1.0, seed=2, max_tokens=40, structured_outputs=StructuredOutputsParams(json=schema))
    (answer,) = llm.chat([{"role": "user", "content": "ok?"}], params, use_tqdm=False)
    assert json.loads(answer.text) in ({"ok": True}, {"ok": False}) and answer.tool_calls == []
