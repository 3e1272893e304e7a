"""Agent frameworks against a live server on smollm2-135m: langchain-openai (`bind_tools`,
`with_structured_output` in each mode), the OpenAI Agents SDK (an agent with a function tool
and an `output_type`) and pydantic-ai (tools, `output_type`, `NativeOutput`).

The assertions are the wire behaviour tallow controls: what the framework sent was accepted,
calls name declared tools with arguments that validate, structured answers parse into the
requested type. What the small model decides (to call a tool or answer) is left open where a
framework allows both.
"""

from __future__ import annotations

import json
import os

import pytest

pydantic = pytest.importorskip("pydantic")
jsonschema = pytest.importorskip("jsonschema")

from server_utils import serve_model  # noqa: E402

MODEL = os.environ.get("TALLOW_AGENT_MODEL", "smollm2-135m")  # the hand-run: qwen2.5-coder-1.5b-instruct


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    country: str = pydantic.Field(max_length=24)


def get_weather(city: str) -> str:
    """The weather in a city."""
    return json.dumps({"city": city, "sky": "sunny", "temp_c": 24})


WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture(scope="module")
def live():
    with serve_model(MODEL, ctx=1024, timeout=float(os.environ.get("TALLOW_AGENT_TIMEOUT", "300"))) as pair:  # room for the 1.5B model on a busy machine
        yield pair


# --------------------------------------------------------------------------- langchain-openai


@pytest.fixture(scope="module")
def chat_model(live):
    lc = pytest.importorskip("langchain_openai")
    server, _ = live
    return lc.ChatOpenAI(model=MODEL, base_url=server.url + "/v1", api_key="x", temperature=0, max_tokens=40, max_retries=0, timeout=300)


def test_langchain_bind_tools_gives_valid_calls(chat_model):
    from langchain_core.tools import tool

    weather = tool(get_weather)
    msg = chat_model.bind_tools([weather], tool_choice="any").invoke("What is the weather in Oslo?")
    assert msg.tool_calls and not msg.invalid_tool_calls
    for call in msg.tool_calls:
        assert call["name"] == "get_weather" and call["id"]
        jsonschema.validate(call["args"], WEATHER_SCHEMA)


@pytest.mark.parametrize("method", ["json_schema", "function_calling", "json_mode"])
def test_langchain_structured_output_in_each_mode(chat_model, method):
    prompt = "Give the city Paris and its country."
    if method == "json_mode":  # the schema is not sent in this mode: the prompt names the keys
        prompt += ' Answer as JSON with the keys "name" and "country".'
    runnable = chat_model.with_structured_output(City, method=method, include_raw=True)
    out = runnable.invoke(prompt)
    assert out["parsing_error"] is None, out["raw"]
    if method == "json_mode":
        assert isinstance(json.loads(out["raw"].content), dict)  # json_object: any object; the keys are the model's
    else:
        assert isinstance(out["parsed"], City)


# --------------------------------------------------------------------------- OpenAI Agents SDK


def test_agents_sdk_agent_with_a_function_tool_and_an_output_type(live):
    agents = pytest.importorskip("agents")
    import openai

    server, _ = live
    agents.set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    model = agents.OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
    calls: list[str] = []

    @agents.function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return get_weather(city)

    agent = agents.Agent(name="travel", instructions="Answer with the city and its country.", tools=[weather], output_type=City, model=model,
                         model_settings=agents.ModelSettings(temperature=0, max_tokens=40))
    try:
        result = agents.Runner.run_sync(agent, "Paris: which country is it in?", max_turns=3)
    except agents.exceptions.MaxTurnsExceeded:
        # The model kept calling the tool: every call reached the tool with a valid argument.
        assert calls and all(isinstance(c, str) for c in calls)
        return
    # Either answer is the wire working: the output_type beside the tool let a formatted answer through.
    assert isinstance(result.final_output, City)


# --------------------------------------------------------------------------- pydantic-ai


@pytest.fixture(scope="module")
def pai_model(live):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    server, _ = live
    return OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=server.url + "/v1", api_key="x"))


def test_pydantic_ai_tool_output_type(pai_model):
    from pydantic_ai import Agent

    agent = Agent(pai_model, output_type=City, model_settings={"temperature": 0, "max_tokens": 40}, retries=0)
    result = agent.run_sync("Paris: which country is it in?")
    assert isinstance(result.output, City)  # through its output tool: a call that validated


def test_pydantic_ai_native_output(pai_model):
    from pydantic_ai import Agent, NativeOutput

    agent = Agent(pai_model, output_type=NativeOutput(City), model_settings={"temperature": 0, "max_tokens": 40}, retries=0)
    result = agent.run_sync("Paris: which country is it in?")
    assert isinstance(result.output, City)  # response_format json_schema, honoured


def test_pydantic_ai_function_tool_beside_an_output_type(pai_model):
    from pydantic_ai import Agent, UsageLimitExceeded
    from pydantic_ai.usage import UsageLimits

    calls: list[str] = []
    agent = Agent(pai_model, output_type=City, model_settings={"temperature": 0, "max_tokens": 40}, retries=0)

    @agent.tool_plain
    def weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return get_weather(city)

    try:
        result = agent.run_sync("What is the weather in Paris, and which country is it in?", usage_limits=UsageLimits(request_limit=3))
    except UsageLimitExceeded:
        assert calls  # the model kept calling the tool, every call valid
        return
    assert isinstance(result.output, City)
    assert all(isinstance(c, str) for c in calls)
