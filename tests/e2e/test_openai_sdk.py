"""End-to-end: the official OpenAI Python SDK against the real binary."""

import json
import urllib.error
import urllib.request

import openai
import pytest

CHAT_MODEL = "smollm2-135m-instruct"
EMBED_MODEL = "all-minilm-l6-v2"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Published sentence-transformers reference values for this sentence.
REFERENCE = [0.06765693, 0.06349593, 0.04871314, 0.07930495, 0.03744806, 0.00265273]


def test_chat_answers_paris(client):
    r = client.chat.completions.create(model=CHAT_MODEL, messages=QUESTION, temperature=0)
    choice = r.choices[0]
    assert "Paris" in choice.message.content
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert r.usage.prompt_tokens > 0
    assert r.usage.completion_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streaming_deltas_concatenate_to_the_plain_answer(client):
    plain = client.chat.completions.create(model=CHAT_MODEL, messages=QUESTION, temperature=0)
    stream = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=QUESTION,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    assert text == plain.choices[0].message.content
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == plain.usage.completion_tokens


def test_completions_respect_max_tokens(client):
    r = client.completions.create(model=CHAT_MODEL, prompt="1, 2, 3,", max_tokens=5, temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5


def test_embeddings_match_the_reference_values(client):
    r = client.embeddings.create(model=EMBED_MODEL, input="This is an example sentence")
    v = r.data[0].embedding
    assert len(v) == 384
    for got, want in zip(v[: len(REFERENCE)], REFERENCE):
        assert abs(got - want) < 1e-4, (v[:6], REFERENCE)


def test_embeddings_in_base64_decode_to_the_same_vector(client):
    # The SDK requests base64 by default and decodes it; compare with floats.
    floats = client.embeddings.create(model=EMBED_MODEL, input=["a", "b"], encoding_format="float")
    b64 = client.embeddings.create(model=EMBED_MODEL, input=["a", "b"])
    for f, b in zip(floats.data, b64.data):
        assert max(abs(x - y) for x, y in zip(f.embedding, b.embedding)) < 1e-6


def test_models_are_listed(client):
    ids = {m.id for m in client.models.list().data}
    assert {CHAT_MODEL, EMBED_MODEL} <= ids


def _assert_openai_error(exc, status):
    assert exc.value.status_code == status
    body = exc.value.body
    assert isinstance(body, dict) and {"message", "type", "param", "code"} <= set(body), body


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=CHAT_MODEL, messages=QUESTION, temperature=5)
    _assert_openai_error(e, 400)
    assert e.value.body["param"] == "temperature"

    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=CHAT_MODEL, messages=[])
    _assert_openai_error(e, 400)
    assert e.value.body["param"] == "messages"

    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=QUESTION)
    _assert_openai_error(e, 404)
    assert e.value.body["code"] == "model_not_found"

    req = urllib.request.Request(
        server["base"] + "/v1/chat/completions",
        data=b'{"model": "smollm2-135m-instruct", "messages": [',
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=30)
    assert http.value.code == 400
    err = json.loads(http.value.read())["error"]
    assert "not valid JSON" in err["message"] and err["type"] == "invalid_request_error"

    # Still serving after all of that.
    r = client.chat.completions.create(model=CHAT_MODEL, messages=QUESTION, temperature=0, max_tokens=4)
    assert r.choices[0].message.content
    assert server["proc"].poll() is None


def test_n_choices_logprobs_and_penalties_through_the_sdk(client):
    r = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=QUESTION,
        n=2,
        seed=7,
        temperature=0.8,
        max_tokens=6,
        logprobs=True,
        top_logprobs=2,
        presence_penalty=0.5,
        frequency_penalty=0.5,
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert sum(len(c.logprobs.content) for c in r.choices) == r.usage.completion_tokens
    for c in r.choices:
        for t in c.logprobs.content:
            assert t.logprob <= 0.0 and len(t.top_logprobs) == 2
    # The same seed gives the same choices again.
    again = client.chat.completions.create(
        model=CHAT_MODEL, messages=QUESTION, n=2, seed=7, temperature=0.8, max_tokens=6,
        presence_penalty=0.5, frequency_penalty=0.5,
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]


CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "country": {"type": "string", "maxLength": 30},
        "population": {"type": "integer", "minimum": 0},
    },
    "required": ["city", "country", "population"],
    "additionalProperties": False,
}


def test_json_schema_output_parses_and_validates_every_time(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model=CHAT_MODEL,
            messages=[{"role": "user", "content": "Describe the capital of France as JSON."}],
            max_tokens=150,
            temperature=0.8,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True},
            },
        )
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        v = json.loads(choice.message.content)
        assert set(v) == {"city", "country", "population"}
        assert isinstance(v["city"], str) and len(v["city"]) <= 30
        assert isinstance(v["population"], int) and v["population"] >= 0


def test_json_object_output_is_an_object_and_bad_formats_are_named(client):
    stream = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": 'Reply with a JSON object whose only key is "answer": what is 2 + 2?'}],
        max_tokens=100,
        temperature=0,
        response_format={"type": "json_object"},
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert isinstance(json.loads(text), dict), text
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=CHAT_MODEL,
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x"}},
        )
    assert e.value.body["param"] == "response_format.json_schema.schema"


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_tool_calls_parse_and_a_tool_result_continues_the_conversation(client):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.chat.completions.create(
        model=CHAT_MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="required",
        max_tokens=100, temperature=0, parallel_tool_calls=False,
    )
    choice = r.choices[0]
    assert len(choice.message.tool_calls) == 1
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    args = json.loads(call.function.arguments)
    assert isinstance(args["city"], str) and len(args["city"]) <= 40
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"},
    ]
    r2 = client.chat.completions.create(
        model=CHAT_MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="none",
        max_tokens=40, temperature=0,
    )
    assert r2.choices[0].message.content
    assert r2.choices[0].message.tool_calls is None
