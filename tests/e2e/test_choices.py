"""n choices (the prompt computed once, then forked) through the official `openai` client."""
import collections

MSGS = [{"role": "user", "content": "Tell me a fact about cats."}]


def test_greedy_choices_are_identical(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=MSGS, max_tokens=10, temperature=0, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) == 1
    one = client.chat.completions.create(model=model_id, messages=MSGS, max_tokens=10, temperature=0)
    assert r.choices[0].message.content == one.choices[0].message.content
    assert r.usage.completion_tokens == 3 * one.usage.completion_tokens
    assert r.usage.prompt_tokens == one.usage.prompt_tokens


def test_choice_i_is_the_request_with_seed_plus_i(client, model_id):
    args = dict(model=model_id, prompt="Once upon a time", max_tokens=12, temperature=1.0)
    r = client.completions.create(n=4, seed=41, **args)
    texts = [c.text for c in sorted(r.choices, key=lambda c: c.index)]
    assert texts == [client.completions.create(seed=41 + i, **args).choices[0].text for i in range(4)]
    assert len(set(texts)) > 1


def test_streamed_choices_equal_whole(client, model_id):
    args = dict(model=model_id, messages=MSGS, max_tokens=12, temperature=0.8, seed=3, n=3)
    whole = client.chat.completions.create(**args)
    text, finish, roles = collections.defaultdict(str), collections.defaultdict(list), collections.Counter()
    usage = None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        usage = chunk.usage or usage
        for ch in chunk.choices:
            roles[ch.index] += ch.delta.role == "assistant"
            text[ch.index] += ch.delta.content or ""
            if ch.finish_reason:
                finish[ch.index].append(ch.finish_reason)
    assert dict(roles) == {0: 1, 1: 1, 2: 1}
    assert [text[i] for i in range(3)] == [c.message.content for c in whole.choices]
    assert [finish[i] for i in range(3)] == [[c.finish_reason] for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_choices_with_logprobs(client, model_id):
    r = client.chat.completions.create(model=model_id, messages=MSGS, max_tokens=6, temperature=1.0, seed=9, n=2,
                                       logprobs=True, top_logprobs=1)
    for c in r.choices:
        assert b"".join(bytes(e.bytes) for e in c.logprobs.content).decode() == c.message.content


def test_best_of_only_equal_to_n(client, model_id):
    import openai
    import pytest
    r = client.completions.create(model=model_id, prompt="Hi", max_tokens=2, n=2, best_of=2)
    assert len(r.choices) == 2
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt="Hi", max_tokens=2, n=2, best_of=3)
    assert e.value.body["param"] == "best_of"
