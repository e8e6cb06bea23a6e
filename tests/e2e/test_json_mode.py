"""JSON mode (response_format json_object) through the official `openai` client."""
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


def test_json_schema_is_refused(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=ASK, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}})
    assert e.value.body["param"] == "response_format"
