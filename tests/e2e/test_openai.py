"""The OpenAI endpoints through the official `openai` client: chat and completions, streaming and not."""
try:  # the openai client of 2026 ships on httpx2, earlier ones on httpx
    import httpx2 as httpx
except ImportError:
    import httpx
import openai
import pytest

MSGS = [{"role": "system", "content": "You are a concise assistant."},
        {"role": "user", "content": "Name three colours."}]


def test_models_and_health(server, client, model_id):
    assert model_id == "SmolLM2-135M-Instruct.Q4_1"
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert client.models.retrieve(model_id).id == model_id


def test_chat_non_streaming(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=MSGS, max_tokens=24, temperature=0)
    c = r.choices[0]
    assert r.object == "chat.completion"
    assert c.message.role == "assistant" and c.message.content
    assert c.finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_matches_non_streaming(client, model_id):
    ref = client.chat.completions.create(model=model_id, messages=MSGS, max_tokens=24, temperature=0)
    stream = client.chat.completions.create(model=model_id, messages=MSGS, max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    text, finish, usage, roles = "", None, None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            text += ch.delta.content or ""
            finish = ch.finish_reason or finish
    assert roles == ["assistant"]
    assert text == ref.choices[0].message.content
    assert finish == ref.choices[0].finish_reason
    assert usage.completion_tokens == ref.usage.completion_tokens


def test_completions(client, model_id):
    r = client.completions.create(model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8
    text = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True))
    assert text == r.choices[0].text


def test_stop_strings_and_seed(client, model_id):
    r = client.completions.create(model=model_id, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0)
    full = r.choices[0].text
    assert len(full) > 4
    stop = full[2:4]
    cut = client.completions.create(model=model_id, prompt="1, 2, 3, 4,", max_tokens=20, temperature=0, stop=[stop])
    assert cut.choices[0].text == full[:full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    a = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=7)
    b = client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=16, temperature=1.0, seed=7)
    assert a.choices[0].text == b.choices[0].text


def test_prefix_cache_hits(server, client, model_id):
    before = server.metrics()["escala_prefix_cache_hit_tokens_total"]
    long_system = {"role": "system", "content": "You are a helpful assistant. " * 20}
    for q in ("What is 2+2?", "What is 3+3?"):
        client.chat.completions.create(model=model_id, messages=[long_system, {"role": "user", "content": q}],
                                       max_tokens=4, temperature=0)
    assert server.metrics()["escala_prefix_cache_hit_tokens_total"] - before >= 100


@pytest.mark.parametrize("kwargs,status,param", [
    ({"model": "gpt-4"}, 404, "model"),
    ({"max_tokens": -1}, 400, "max_tokens"),
    ({"max_tokens": "ten"}, 400, "max_tokens"),
    ({"max_tokens": 10 ** 9}, 400, "max_tokens"),
    ({"temperature": 5}, 400, "temperature"),
    ({"top_p": "x"}, 400, "top_p"),
    ({"n": 17}, 400, "n"),
    ({"stop": [1, 2]}, 400, "stop"),
    ({"messages": []}, 400, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ({"messages": [{"role": "user", "content": "word " * 20000}]}, 400, "messages"),
])
def test_chat_errors(client, model_id, kwargs, status, param):
    args = {"model": model_id, "messages": MSGS, "max_tokens": 4}
    args.update(kwargs)
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(**args)
    assert e.value.status_code == status
    err = e.value.body if isinstance(e.value.body, dict) else {}
    err = err.get("error", err)
    assert err.get("param") == param
    assert err.get("message") and err.get("type")


def test_metrics_format(server):
    text = httpx.get(server.url + "/metrics").text
    for name in ("escala_requests_running", "escala_requests_waiting", "escala_generation_tokens_per_second",
                 "escala_time_to_first_token_seconds_bucket", "escala_kv_blocks_used", "escala_kv_blocks_free",
                 "escala_kv_blocks_cached", "escala_prefix_cache_hit_rate", "escala_preemptions_total"):
        assert name in text
