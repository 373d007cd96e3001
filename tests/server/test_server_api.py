"""The HTTP API on a tiny model through real clients: the official openai package and httpx."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say something."}]


@pytest.fixture
def client(qwen2_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{qwen2_server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=60)


def test_openai_client_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 6 and whole.usage.prompt_tokens > 10
    timings = whole.model_extra["timings"]
    assert timings["predicted_n"] == 6 and {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_per_second",
                                             "draft_n", "draft_n_accepted"} <= set(timings)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content  # greedy: the same tokens either way
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    # the second request had the same prompt: all of it but the pending token came from the prefix cache
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == whole.usage.prompt_tokens - 1


def test_completions_echo_and_logprobs(qwen2_server, client: openai.OpenAI) -> None:
    out = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=5, temperature=0, logprobs=3)
    choice = out.choices[0]
    assert out.usage.completion_tokens == 5 and len(choice.logprobs.tokens) == 5
    assert "".join(choice.logprobs.tokens) == choice.text
    for chosen, value, top in zip(choice.logprobs.tokens, choice.logprobs.token_logprobs, choice.logprobs.top_logprobs):
        assert value <= 0 and len(top) == 3
        assert max(top.values()) == pytest.approx(value)  # greedy picks the likeliest token
        assert top[chosen] == pytest.approx(value)
    echoed = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=5, temperature=0, echo=True)
    assert echoed.choices[0].text == "def add(a, b):" + choice.text
    ids = post(qwen2_server, "/tokenize", {"content": "def add(a, b):"}).json()["tokens"]
    by_ids = client.completions.create(model="tiny", prompt=ids, max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == choice.text


def test_stop_string_across_a_token_boundary(qwen2_server, client: openai.OpenAI) -> None:
    free = client.completions.create(model="tiny", prompt="x = ", max_tokens=10, temperature=0)
    text = free.choices[0].text
    pieces = post(qwen2_server, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert len(pieces) >= 4 and all(isinstance(p["piece"], str) for p in pieces)
    boundary = len(pieces[0]["piece"]) + len(pieces[1]["piece"])  # the end of the second token's text
    stop = text[boundary - 1 : boundary + 2]  # spans the boundary between the second and third tokens
    assert len(stop) == 3 and text.find(stop) == boundary - 1
    for stream in (False, True):
        body = {"prompt": "x = ", "max_tokens": 10, "temperature": 0, "stop": [stop, "never-seen"], "stream": stream}
        response = post(qwen2_server, "/v1/completions", body)
        if stream:
            events = [json.loads(line[6:]) for line in response.text.splitlines()
                      if line.startswith("data: {")]
            got = "".join(e["choices"][0]["text"] for e in events)
            reason = events[-1]["choices"][0]["finish_reason"]
        else:
            got, reason = response.json()["choices"][0]["text"], response.json()["choices"][0]["finish_reason"]
        assert (got, reason) == (text[: boundary - 1], "stop")


def test_seed_logit_bias_and_penalties(client: openai.OpenAI) -> None:
    def reply(**knobs) -> str:
        out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, **knobs)
        return out.choices[0].message.content

    assert reply(temperature=2.0, seed=7) == reply(temperature=2.0, seed=7)
    assert len({reply(temperature=2.0, seed=s) for s in (7, 8, 9, 10)}) > 1
    forced = reply(temperature=0, logit_bias={"15": 100})  # token 15 is "0"
    assert forced == "0" * 8
    # a huge frequency penalty forbids any token twice under greedy decoding
    varied = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0,
                                            frequency_penalty=2.0, logit_bias={"15": 3.5}, logprobs=True)
    chosen = [entry.token for entry in varied.choices[0].logprobs.content]
    assert len(chosen) == 8 and chosen.count("0") <= 1


def test_seed_minus_one_is_a_random_seed(client: openai.OpenAI) -> None:
    def reply(**knobs):
        return client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, **knobs)

    # llama.cpp's "no seed": served (it used to fail on the engine thread, a 500 that also dropped the prefix cache)
    texts = {reply(temperature=2.0, seed=-1).choices[0].message.content for _ in range(4)}
    assert len(texts) > 1  # fresh entropy each time, not one fixed seed
    again = reply(temperature=2.0, seed=-1)
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1  # the session survived


def test_a_tiny_temperature_is_greedy(client: openai.OpenAI) -> None:
    greedy = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    for temperature in (1e-310, 1e-30):  # 1e-310 is subnormal: logits / T overflowed to inf, then NaN
        tiny = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=temperature)
        assert tiny.choices[0].message.content == greedy.choices[0].message.content


def test_models_tokenize_detokenize(qwen2_server) -> None:
    models = httpx.get(f"{qwen2_server.url}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["meta"]["n_ctx"] == 512
    ids = post(qwen2_server, "/tokenize", {"content": "héllo wörld <|im_end|>"}).json()["tokens"]
    assert ids[-1] == 151645  # special tokens are parsed
    assert post(qwen2_server, "/detokenize", {"tokens": ids}).json()["content"] == "héllo wörld <|im_end|>"
    assert httpx.get(f"{qwen2_server.url}/models").status_code == 200  # llama-server's paths without /v1 too


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"messages": MESSAGES, "n": 2}, "n", "n > 1"),
    ({"messages": MESSAGES, "top_k": -3}, "top_k", ">= -1"),
    ({"messages": MESSAGES, "temperature": -1}, "temperature", "between"),
    ({"messages": MESSAGES, "top_p": 0}, "top_p", "(0, 1]"),
    ({"messages": MESSAGES, "logit_bias": {"999999": 1}}, "logit_bias", "outside the vocabulary"),
    ({"messages": MESSAGES, "tool_choice": "required"}, "tool_choice", "not supported"),
    ({"messages": MESSAGES, "response_format": {"type": "json_object"}}, "response_format", "not supported"),
    ({"messages": MESSAGES, "frobnicate": 1}, "frobnicate", "unrecognized"),
    ({"messages": MESSAGES, "top_logprobs": 2}, "top_logprobs", "needs logprobs"),
    ({"messages": MESSAGES, "stream_options": {"include_usage": True}}, "stream_options", "stream is true"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "one of"),
    ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens", ">= 1"),
    ({"messages": MESSAGES, "seed": -2}, "seed", ">= -1"),  # -1 is llama.cpp's "random"; below it is nothing
    ({"messages": MESSAGES, "seed": 1.5}, "seed", "integer"),
    ({"messages": MESSAGES, "seed": "7"}, "seed", "integer"),
])
def test_bad_requests_name_the_field(qwen2_server, body: dict, param: str, words: str) -> None:
    response = post(qwen2_server, "/v1/chat/completions", body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and words in error["message"] and error["type"] == "invalid_request_error"


def test_malformed_json_and_unknown_route(qwen2_server) -> None:
    response = httpx.post(f"{qwen2_server.url}/v1/chat/completions", content=b"{not json", timeout=10)
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    assert httpx.get(f"{qwen2_server.url}/v1/nothing").json()["error"]["code"] == 404


def test_prompt_past_the_context_window(qwen2_server, client: openai.OpenAI) -> None:
    long = [{"role": "user", "content": "word " * 600}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=long, max_tokens=4)
    message = caught.value.body["message"]
    count = int(message.split("do not fit")[0].split()[-2])
    assert count > 512 and "context window of 512 tokens" in message
    # the server is still fine
    assert client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).usage.completion_tokens == 2


def test_metrics_follow_the_requests(qwen2_server, client: openai.OpenAI) -> None:
    before = {name: qwen2_server.metric(name) for name in (
        "openjet_generated_tokens_total", "openjet_prompt_tokens_total", "openjet_prefix_cache_hit_tokens_total",
        "openjet_verify_passes_total")}
    reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "A new prompt."}],
                                           max_tokens=7, temperature=0)
    timings = reply.model_extra["timings"]
    after = {name: qwen2_server.metric(name) for name in before}
    assert after["openjet_generated_tokens_total"] - before["openjet_generated_tokens_total"] == 7
    assert after["openjet_prompt_tokens_total"] - before["openjet_prompt_tokens_total"] == timings["prompt_n"]
    assert (after["openjet_prefix_cache_hit_tokens_total"] - before["openjet_prefix_cache_hit_tokens_total"]
            == timings["cache_n"])
    passes = after["openjet_verify_passes_total"] - before["openjet_verify_passes_total"]
    assert 1 <= passes <= 7
    assert qwen2_server.metric("openjet_acceptance_length") == pytest.approx(7 / passes)
    assert qwen2_server.metric("openjet_decode_tokens_per_second") > 0
    assert qwen2_server.metric("openjet_context_size") == 512
    assert qwen2_server.metric("openjet_context_tokens") == reply.usage.prompt_tokens + 7 - 1
    info = 'backend="reference",backend_reason="requested with --backend reference",draft="ngram",model="'
    text = httpx.get(f"{qwen2_server.url}/metrics").text
    assert f"openjet_backend_info{{{info}" in text
