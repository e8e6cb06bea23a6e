"""Structured output (response_format json_object and json_schema) through the official `openai` client."""
import json

import openai
import pytest

ASK = [{"role": "user", "content": "Give me a JSON object describing a person with keys name and age."}]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_chat_json_object(client, model_id, seed):
    r = client.chat.completions.create(model=model_id, messages=ASK, max_tokens=200, temperature=0.8, seed=seed,
                                       response_format={"type": "json_object"})
    c = r.choices[0]
    assert c.finish_reason == "stop"
    assert isinstance(json.loads(c.message.content), dict)


def test_streamed_json_equals_whole_and_completions(client, model_id):
    args = dict(model=model_id, messages=ASK, max_tokens=200, temperature=0, response_format={"type": "json_object"})
    whole = client.chat.completions.create(**args).choices[0].message.content
    streamed = "".join(ch.choices[0].delta.content or "" for ch in client.chat.completions.create(stream=True, **args)
                       if ch.choices)
    assert streamed == whole and isinstance(json.loads(whole), dict)
    r = client.completions.create(model=model_id, prompt="A person as JSON:", max_tokens=200, temperature=0,
                                  extra_body={"response_format": {"type": "json_object"}})
    assert r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].text), dict)


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                                           "role": {"enum": ["admin", "user"]}},
          "required": ["name", "age", "role"], "additionalProperties": False}


@pytest.mark.parametrize("seed", [4, 5])
def test_chat_json_schema(client, model_id, seed):
    r = client.chat.completions.create(
        model=model_id, messages=ASK, max_tokens=200, temperature=0.8, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}})
    c = r.choices[0]
    assert c.finish_reason == "stop"
    p = json.loads(c.message.content)
    keys = list(p)
    assert keys[:2] == ["name", "age"] and "role" in keys and set(keys) <= set(PERSON["properties"])
    assert isinstance(p["name"], str) and isinstance(p["age"], int) and p["role"] in ("admin", "user")
    assert len(p.get("hobbies", [])) <= 3 and all(isinstance(h, str) for h in p.get("hobbies", []))


BOUNDED = {"type": "object", "properties": {"name": {"type": "string", "minLength": 2, "maxLength": 6},
                                            "age": {"type": "integer", "minimum": 18, "exclusiveMaximum": 100},
                                            "offset": {"type": "integer", "minimum": -5, "maximum": 5}},
           "required": ["name", "age", "offset"], "additionalProperties": False}


@pytest.mark.parametrize("seed", [6, 7])
def test_chat_json_schema_lengths_and_bounds(client, model_id, seed):
    r = client.chat.completions.create(
        model=model_id, messages=ASK, max_tokens=200, temperature=0.8, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "bounded", "schema": BOUNDED}})
    c = r.choices[0]
    assert c.finish_reason == "stop"
    p = json.loads(c.message.content)
    assert list(p) == ["name", "age", "offset"]
    assert 2 <= len(p["name"]) <= 6  # code points, as Python counts
    assert isinstance(p["age"], int) and 18 <= p["age"] < 100
    assert isinstance(p["offset"], int) and -5 <= p["offset"] <= 5


@pytest.mark.parametrize("schema,message", [
    ({"type": "number", "minimum": 0}, "'minimum' is supported on integers only"),
    ({"type": "string", "pattern": "^a"}, "'pattern' is not supported"),
    ({"type": "object", "properties": {"a": {"$ref": "#/$defs/X"}}}, "is not defined"),
])
def test_unsupported_schemas_are_refused(client, model_id, schema, message):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=ASK, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert e.value.body["param"] == "response_format.json_schema.schema" and message in e.value.body["message"]
