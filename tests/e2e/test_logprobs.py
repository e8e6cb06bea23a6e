"""logprobs and logit_bias through the official `openai` client, chat and completions, streaming and not."""
import math

try:  # the openai client of 2026 ships on httpx2, earlier ones on httpx
    import httpx2 as httpx
except ImportError:
    import httpx
import openai
import pytest

MSGS = [{"role": "user", "content": "Write one sentence about the sea."}]


def chat(client, model_id, **kw):
    args = {"model": model_id, "messages": MSGS, "max_tokens": 12, "temperature": 0}
    args.update(kw)
    return client.chat.completions.create(**args)


def test_chat_logprobs_describe_the_greedy_tokens(client, model_id):
    r = chat(client, model_id, logprobs=True, top_logprobs=5)
    c = r.choices[0]
    content = c.logprobs.content
    assert len(content) == r.usage.completion_tokens
    # The tokens' bytes are the message, and greedy picked the most likely token every time.
    assert b"".join(bytes(e.bytes) for e in content).decode() == c.message.content
    for e in content:
        assert e.logprob <= 0 and len(e.top_logprobs) == 5
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob)
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True) and sum(math.exp(x) for x in lps) <= 1 + 1e-5


def test_chat_logprobs_streamed_equal_whole(client, model_id):
    whole = chat(client, model_id, logprobs=True, top_logprobs=2).choices[0].logprobs.content
    streamed = []
    for chunk in chat(client, model_id, logprobs=True, top_logprobs=2, stream=True):
        for ch in chunk.choices:
            if ch.logprobs and ch.logprobs.content:
                streamed += ch.logprobs.content
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]
    assert [[t.token for t in e.top_logprobs] for e in streamed] == [[t.token for t in e.top_logprobs] for e in whole]


def test_no_logprobs_unless_asked(client, model_id):
    assert chat(client, model_id, max_tokens=2).choices[0].logprobs is None
    assert chat(client, model_id, max_tokens=2, logprobs=True).choices[0].logprobs.content[0].top_logprobs == []


def test_completion_logprobs(client, model_id):
    args = dict(model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0)
    r = client.completions.create(logprobs=3, **args)
    c = r.choices[0]
    lp = c.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert "".join(lp.tokens) == c.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    for tok, x, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 3 and max(top.values()) == pytest.approx(x) and tok in top
    streamed = []
    for chunk in client.completions.create(logprobs=3, stream=True, **args):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.token_logprobs
    assert streamed == lp.token_logprobs


def token_ids(server, text):
    r = httpx.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False})
    assert r.status_code == 200
    return r.json()["tokens"]


def test_logit_bias_bans_and_forces_tokens(server, client, model_id):
    first = chat(client, model_id, max_tokens=1, logprobs=True, top_logprobs=2).choices[0].logprobs.content[0]
    ids = token_ids(server, first.token)
    assert len(ids) == 1
    # Banned, the greedy first token gives way to the runner-up.
    banned = chat(client, model_id, max_tokens=1, logprobs=True, logit_bias={str(ids[0]): -100})
    assert banned.choices[0].logprobs.content[0].token == first.top_logprobs[1].token
    # +100 on one token makes greedy pick it every time; logprobs stay the model's own.
    (blue,) = token_ids(server, " blue")
    forced = client.completions.create(model=model_id, prompt="Hello", max_tokens=3, temperature=0,
                                       logit_bias={str(blue): 100}, logprobs=1)
    lp = forced.choices[0].logprobs
    assert lp.tokens == [" blue"] * 3 and forced.choices[0].text == " blue blue blue"
    assert all(x < max(top.values()) or x == pytest.approx(max(top.values())) for x, top in zip(lp.token_logprobs, lp.top_logprobs))


def test_tokenize_and_detokenize(server):
    text = "Hello <|im_start|> world, naïve café!"
    r = httpx.post(server.url + "/tokenize", json={"prompt": text}).json()
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] > 0
    assert httpx.post(server.url + "/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == text
    for path, body in (("/tokenize", {"prompt": 5}), ("/tokenize", {}), ("/detokenize", {"tokens": [-1]}),
                       ("/detokenize", {"tokens": "x"}), ("/tokenize", "[1"), ("/tokenize", {"prompt": "a", "model": "gpt"})):
        resp = httpx.post(server.url + path, **({"json": body} if not isinstance(body, str) else {"content": body}))
        assert resp.status_code in (400, 404) and resp.json()["error"]["message"]


@pytest.mark.parametrize("kwargs,param", [
    ({"logit_bias": {"abc": 1}}, "logit_bias.abc"),
    ({"logit_bias": {"01": 1}}, "logit_bias.01"),
    ({"logit_bias": {"99999999": 1}}, "logit_bias.99999999"),
    ({"logit_bias": {"5": 101}}, "logit_bias.5"),
    ({"logit_bias": {"5": "x"}}, "logit_bias.5"),
    ({"logit_bias": [1]}, "logit_bias"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": 3}, "logprobs"),
])
def test_logprobs_and_bias_errors(client, model_id, kwargs, param):
    with pytest.raises(openai.APIStatusError) as e:
        chat(client, model_id, max_tokens=2, **kwargs)
    assert e.value.status_code == 400
    err = e.value.body if isinstance(e.value.body, dict) else {}
    assert err.get("error", err).get("param") == param
