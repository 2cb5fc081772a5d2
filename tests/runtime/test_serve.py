"""`specrt serve`: the real server on a loopback port, called with the official openai client and
raw HTTP. Greedy answers equal model.generate token for token; bad requests get OpenAI's error
shape and the server keeps serving; the concurrency limit answers 429; a client that goes away
stops its generation and frees its slot; a request's deadline ends its answer with finish_reason
"timeout"."""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="the serve extra is not installed")
openai = pytest.importorskip("openai", reason="the openai client (dev extra) is not installed")

import specrt  # noqa: E402
from specrt.serve import ServeConfig, Speculation, build_app, serve_in_thread  # noqa: E402
from specrt.serve.stops import StopCutter  # noqa: E402
from tests.helpers import with_chat  # noqa: E402

# A chat template under which the tiny model answers (it continues the user's text): a system
# prompt in brackets on its own line, user turns as they are, assistant turns closed by EOS.
TEMPLATE = ("{% for m in messages %}{% if m.role == 'system' %}[{{ m.content }}]\n{% elif m.role == 'user' %}"
            "{{ m.content }}{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}")
LONG = 240  # tokens of a generation that outlasts a few HTTP round trips ("hello" repeats "o" to the end)


@pytest.fixture(scope="module")
def folder(runtime_chat_artifact, tmp_path_factory) -> Path:
    """The tiny Qwen2 artifact with :data:`TEMPLATE` as its chat template."""
    return with_chat(runtime_chat_artifact, tmp_path_factory.mktemp("tiny-serve") / "fp32", TEMPLATE,
                     chat={"prefix": "", "suffix": ""})


@pytest.fixture(scope="module")
def model(folder):
    return specrt.load(folder, prefix_cache_mb=16)


def _serve(model, max_concurrent: int) -> Iterator[int]:
    """Run the app on a free loopback port in a thread; yield the port."""
    config = ServeConfig(model_id="tiny-qwen2", speculation=Speculation("pld", tree=False, draft_budget=8),
                         max_concurrent=max_concurrent)
    local = serve_in_thread(build_app(model, config), timeout_s=30)
    yield local.port
    local.stop()


@pytest.fixture(scope="module")
def port(model):
    yield from _serve(model, max_concurrent=4)


@pytest.fixture(scope="module")
def port_one(model):
    """A server that runs one generation at a time."""
    yield from _serve(model, max_concurrent=1)


@pytest.fixture(scope="module")
def client(port):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)


def request(port: int, method: str, path: str, body: object = None, raw: bytes | None = None):
    """(status, headers, parsed JSON body) of one plain HTTP request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    payload = response.read()
    conn.close()
    return response.status, dict(response.getheaders()), json.loads(payload)


def open_stream(port: int, body: dict) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    """A streaming request whose first event has arrived (its generation is running)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", body=json.dumps(body | {"stream": True}),
                  headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"data: {")
    return conn, response


def wait_idle(port: int) -> None:
    deadline = time.monotonic() + 10
    while request(port, "GET", "/health")[2]["in_flight"]:
        assert time.monotonic() < deadline, "the slot was never given back"
        time.sleep(0.01)


# --- stop strings, without a server -------------------------------------------------------------

def test_stop_cutter_holds_back_a_split_stop_string():
    cut = StopCutter(("END",))
    assert [cut.push(p) for p in ["ab", "cE", "N", "x"]] == ["ab", "c", "", "ENx"]  # "EN" then "x": no stop
    assert cut.flush() == "" and not cut.stopped
    cut = StopCutter(("END", "c!"))
    assert [cut.push(p) for p in ["ab", "cE", "ND tail"]] == ["ab", "c", ""]
    assert cut.stopped and cut.flush() == "" and cut.push("more") == ""


def test_stop_cutter_flushes_a_held_prefix_at_the_end():
    cut = StopCutter(("xyz",))
    assert cut.push("abcxy") == "abc"
    assert cut.flush() == "xy"


# --- equality with plain decoding ---------------------------------------------------------------

PROMPTS = ["def add(a, b):", "The quick brown fox", "hello"]


@pytest.mark.parametrize("method", ["baseline", "pld"])
def test_completions_equal_generate(model, client, method):
    for prompt in PROMPTS:
        want = model.generate(prompt, method=method, max_new_tokens=40)
        got = client.completions.create(model="tiny-qwen2", prompt=prompt, max_tokens=40, temperature=0,
                                        extra_body={"specrt": {"method": method}})
        assert got.choices[0].text == want.text
        assert got.specrt["token_ids"] == list(want.token_ids)
        assert got.choices[0].finish_reason == {"eos": "stop", "length": "length"}[want.finish_reason]
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert got.usage.completion_tokens == len(want.token_ids)
        assert got.specrt["method"] == method and got.specrt["decode_tokens_per_s"] >= 0


def test_literal_completions(client):
    got = client.completions.create(model="tiny-qwen2", prompt="def add(a, b):", temperature=0)
    assert got.choices[0].text == "\n    return return return + b\n"
    assert got.choices[0].finish_reason == "stop"  # the model's EOS
    assert got.specrt["method"] == "pld"  # the server's default
    got = client.completions.create(model="tiny-qwen2", prompt="hello", temperature=0, max_tokens=5)
    assert (got.choices[0].text, got.choices[0].finish_reason) == ("ooooo", "length")


@pytest.mark.parametrize("method", ["baseline", "pld"])
def test_streamed_completions_equal_generate(model, client, method):
    for prompt in PROMPTS:
        want = model.generate(prompt, method=method, max_new_tokens=40)
        chunks = list(client.completions.create(
            model="tiny-qwen2", prompt=prompt, max_tokens=40, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"specrt": {"method": method, "tree": True}}))
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
        last = [c for c in chunks if c.choices][-1]
        assert last.specrt["token_ids"] == list(want.token_ids) and last.specrt["tree"] is True
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.token_ids)


def test_chat_equals_model_chat(model, client):
    msgs = [{"role": "user", "content": "def add(a, b):"}]
    want = model.chat(msgs, method="pld", max_new_tokens=40)
    assert want.text == "\n    return return return + b\n"
    got = client.chat.completions.create(model="tiny-qwen2", temperature=0, max_tokens=40, messages=msgs)
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.text
    assert got.specrt["token_ids"] == list(want.token_ids)
    assert got.usage.prompt_tokens == len(model.encode("def add(a, b):"))
    chunks = list(client.chat.completions.create(
        model="tiny-qwen2", temperature=0, max_tokens=40, stream=True,
        messages=[{"role": "user", "content": [{"type": "text", "text": "def add(a, b):"}]}]))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == {"eos": "stop", "length": "length"}[want.finish_reason]


def test_chat_with_a_system_prompt_and_earlier_turns(model, client):
    msgs = [{"role": "system", "content": "code"}, {"role": "user", "content": "def add(a, b):"},
            {"role": "assistant", "content": "\n    return a + b\n"}, {"role": "user", "content": "The quick brown"}]
    prompt = "[code]\ndef add(a, b):\n    return a + b\n<eos>The quick brown"  # TEMPLATE, literally
    want, _ = model.generate_ids(model.tokenizer.encode(prompt, add_special_tokens=False).ids, method="baseline",
                                 max_new_tokens=20)
    for method in ("baseline", "pld"):
        got = client.chat.completions.create(model="tiny-qwen2", temperature=0, max_tokens=20, messages=msgs,
                                             extra_body={"specrt": {"method": method}})
        assert got.specrt["token_ids"] == want.tolist()
        assert got.choices[0].message.content == model.tokenizer.decode(want.tolist(), skip_special_tokens=True)
        assert got.usage.prompt_tokens == len(model.tokenizer.encode(prompt, add_special_tokens=False).ids)


def test_seeded_sampling_repeats_and_equals_generate(model, client):
    want = model.generate("The quick brown fox", method="pld", max_new_tokens=30, temperature=0.8, seed=7)
    for _ in range(2):
        got = client.completions.create(model="tiny-qwen2", prompt="The quick brown fox", max_tokens=30,
                                        temperature=0.8, seed=7)
        assert got.specrt["token_ids"] == list(want.token_ids)


def test_concurrent_clients_each_get_their_single_run(model, port):
    # 16 requests from 4 clients at once (the server's limit), streamed and not, two methods
    jobs = [(prompt, method, stream) for prompt in PROMPTS[:2] for method in ("baseline", "pld")
            for stream in (False, True)] * 2
    want = {(p, m): model.generate(p, method=m, max_new_tokens=40).text
            for p in PROMPTS[:2] for m in ("baseline", "pld")}
    got: dict[int, str] = {}

    def client_thread(k: int) -> None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        for i in range(k, len(jobs), 4):
            prompt, method, stream = jobs[i]
            out = client.completions.create(model="tiny-qwen2", prompt=prompt, max_tokens=40, temperature=0,
                                            stream=stream, extra_body={"specrt": {"method": method}})
            got[i] = "".join(c.choices[0].text for c in out) if stream else out.choices[0].text

    threads = [threading.Thread(target=client_thread, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert got == {i: want[(p, m)] for i, (p, m, _) in enumerate(jobs)}
    assert request(port, "GET", "/health")[2]["in_flight"] == 0


# --- logprobs ----------------------------------------------------------------------------------

def test_logprobs_equal_the_runtime_s(model, client):
    want = model.generate("The quick brown fox", method="baseline", max_new_tokens=12, logprobs=2)
    want_lp = [lp.logprob for lp in want.logprobs]
    got = client.completions.create(model="tiny-qwen2", prompt="The quick brown fox", max_tokens=12, temperature=0,
                                    logprobs=2, extra_body={"specrt": {"method": "pld", "tree": True}})
    lp = got.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx(want_lp, abs=1e-4)
    assert lp.tokens == [model.tokenizer.decode([t], skip_special_tokens=False) for t in want.token_ids]
    assert lp.tokens[-1] == "<eos>" and "".join(lp.tokens[:-1]) == got.choices[0].text  # EOS: counted, no text
    assert lp.text_offset[:2] == [0, len(lp.tokens[0])]
    assert [len(top) for top in lp.top_logprobs] == [2] * len(want.token_ids)
    chunks = list(client.completions.create(model="tiny-qwen2", prompt="The quick brown fox", max_tokens=12,
                                            temperature=0, logprobs=0, stream=True))
    streamed = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed == pytest.approx(want_lp, abs=1e-4)
    chat = client.chat.completions.create(model="tiny-qwen2", temperature=0, max_tokens=12, logprobs=True,
                                          top_logprobs=3, messages=[{"role": "user", "content": "The quick brown fox"}])
    content = chat.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx(want_lp, abs=1e-4)
    assert [len(c.top_logprobs) for c in content] == [3] * len(content)
    assert content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob
    assert bytes(content[0].bytes).decode() == content[0].token
    plain = client.completions.create(model="tiny-qwen2", prompt="hello", max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None


# --- stop strings ------------------------------------------------------------------------------

def test_stop_strings_split_across_tokens(client):
    # "def add(a, b):" -> "\n   | return| return| return| +| b|\n": "rn + b" spans three tokens
    for stream in (False, True):
        got = client.completions.create(model="tiny-qwen2", prompt="def add(a, b):", temperature=0,
                                        stop=["rn + b", "zzz"], stream=stream)
        if stream:
            chunks = list(got)
            text, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            text, reason = got.choices[0].text, got.choices[0].finish_reason
        assert (text, reason) == ("\n    return return retu", "stop")
    # "ps|ps|...|ps|.": "sps." spans the last two tokens
    got = client.completions.create(model="tiny-qwen2", prompt="The quick brown fox", temperature=0, stop="sps.")
    assert got.choices[0].text == "pspspspspsp"  # "ps" * 5 + "p"
    got = client.completions.create(model="tiny-qwen2", prompt="The quick brown fox", temperature=0, stop="nope")
    assert (got.choices[0].text, got.choices[0].finish_reason) == ("pspspspspspsps.", "stop")  # "ps" * 7 + "." + EOS


def test_stop_token_ids_end_the_answer_without_their_text(client):
    # "def add(a, b):" -> ids 265 278 278 278 288 274 199 0: "\n   | return| return| return| +| b|\n|<eos>"
    for stream in (False, True):
        got = client.completions.create(model="tiny-qwen2", prompt="def add(a, b):", temperature=0, stream=stream,
                                        extra_body={"stop_token_ids": [288, 199]})
        if stream:
            chunks = [c for c in got if c.choices]
            text, last = "".join(c.choices[0].text for c in chunks), chunks[-1]
        else:
            text, last = got.choices[0].text, got
        assert (text, last.choices[0].finish_reason) == ("\n    return return return", "stop")
        assert last.specrt["token_ids"] == [265, 278, 278, 278, 288]


# --- errors -------------------------------------------------------------------------------------

BAD = [  # (path, body, raw bytes, status, param, code, message pattern)
    ("/v1/completions", None, b"{not json", 400, None, None, r"^the request body is not valid JSON"),
    ("/v1/completions", [1, 2], None, 400, None, None, r"must be a JSON object, got list"),
    ("/v1/completions", {"model": "m"}, None, 400, "prompt", None, r"^missing required field: prompt$"),
    ("/v1/chat/completions", {"model": "m"}, None, 400, "messages", None, r"^missing required field: messages$"),
    ("/v1/completions", {"prompt": "hi", "specrt": {"method": "nope"}}, None, 400, "specrt.method",
     "unknown_method", r"^unknown method 'nope'; valid methods: adapld, "),
    ("/v1/completions", {"prompt": "hi", "specrt": {"budget": 3}}, None, 400, "specrt.budget", None,
     r"unknown field specrt.budget"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, None, 400, "max_tokens", None,
     r"^max_tokens must be an integer in \[1, 255\] \(the model's context is 256 tokens\), got -1$"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 10**9}, None, 400, "max_tokens", None, r"got 1000000000$"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "8"}, None, 400, "max_tokens", None, r"got '8'$"),
    ("/v1/completions", {"prompt": "hi " * 300}, None, 400, "prompt", "context_length_exceeded",
     r"^the prompt has 900 tokens; this model's context is 256 tokens"),
    ("/v1/completions", {"prompt": "hi", "n": 2}, None, 400, "n", None, r"^n must be 1"),
    ("/v1/completions", {"prompt": "hi", "temperature": 3}, None, 400, "temperature", None, r"in \[0.0, 2.0\]"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 6}, None, 400, "logprobs", None,
     r"^logprobs must be an integer in \[0, 5\], got 6$"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}, None, 400,
     "top_logprobs", None, r"^top_logprobs needs logprobs: true$"),
    ("/v1/completions", {"prompt": "hi", "echo": True}, None, 400, "echo", "unsupported_parameter", r""),
    ("/v1/completions", {"prompt": "hi", "stop": ["a", ""]}, None, 400, "stop", None, r"non-empty"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [-1]}, None, 400, "stop_token_ids", None,
     r"^stop_token_ids must be a list of token ids in \[0, \d+\)$"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 7}]}, None, 400, "messages[0].content",
     None, r"^messages\[0\]\.content must be a string or a list of text parts, got int$"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]},
     None, 400, "messages[1].role", None, r"^messages\[1\]\.role must be one of system, user, assistant, tool"),
    ("/v1/chat/completions", {"messages": []}, None, 400, "messages", None, r"^messages must be a non-empty list"),
    ("/v1/completions", {"prompt": "hi", "specrt": {"timeout_s": 0}}, None, 400, "specrt.timeout_s", None,
     r"^specrt.timeout_s must be a positive finite number of seconds, got 0$"),
    ("/v1/completions", {"prompt": "hi", "specrt": {"timeout_s": -2.5}}, None, 400, "specrt.timeout_s", None,
     r"got -2.5$"),
    ("/v1/completions", {"prompt": "hi", "specrt": {"timeout_s": "2"}}, None, 400, "specrt.timeout_s", None,
     r"got '2'$"),
    ("/v1/completions", {"prompt": "hi", "specrt": {"timeout_s": True}}, None, 400, "specrt.timeout_s", None,
     r"got True$"),
    ("/v1/completions", None, b'{"prompt": "hi", "specrt": {"timeout_s": Infinity}}', 400, "specrt.timeout_s", None,
     r"got inf$"),
    ("/v1/nope", {}, None, 404, None, "not_found", r"^POST /v1/nope: Not Found$"),
]


@pytest.mark.parametrize("path, body, raw, status, param, code, message", BAD)
def test_bad_request_gets_its_error_and_the_server_keeps_serving(port, path, body, raw, status, param, code, message):
    got_status, _, got = request(port, "POST", path, body, raw)
    assert got_status == status
    assert set(got) == {"error"} and set(got["error"]) == {"message", "type", "param", "code"}
    assert got["error"]["type"] == "invalid_request_error"
    assert (got["error"]["param"], got["error"]["code"]) == (param, code)
    assert re.search(message, got["error"]["message"]), got["error"]["message"]
    ok_status, _, ok = request(port, "POST", "/v1/completions", {"prompt": "hello", "max_tokens": 3, "temperature": 0})
    assert (ok_status, ok["choices"][0]["text"]) == (200, "ooo")
    assert request(port, "GET", "/health")[2]["in_flight"] == 0


def test_models_and_health(port):
    status, _, models = request(port, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in models["data"]] == ["tiny-qwen2"]
    assert request(port, "GET", "/health")[2] == {"status": "ok", "in_flight": 0, "max_concurrent": 4}


# --- concurrency and disconnects ----------------------------------------------------------------

LONG_BODY = {"prompt": "hello", "max_tokens": LONG, "temperature": 0, "specrt": {"method": "baseline"}}


def test_over_the_limit_gets_429_then_the_slot_frees(port_one):
    conn, _ = open_stream(port_one, LONG_BODY)
    try:
        status, headers, body = request(port_one, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2})
        assert (status, headers["retry-after"]) == (429, "1")
        assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "too_many_requests"
    finally:
        conn.close()
    wait_idle(port_one)
    status, _, body = request(port_one, "POST", "/v1/completions", {"prompt": "hello", "max_tokens": 3,
                                                                     "temperature": 0})
    assert (status, body["choices"][0]["text"]) == (200, "ooo")


def test_disconnect_mid_stream_stops_the_generation(port_one, caplog):
    caplog.set_level(logging.INFO, logger="specrt.serve.app")
    conn, response = open_stream(port_one, LONG_BODY)
    response.close()
    conn.close()
    wait_idle(port_one)
    stopped = [int(m.group(1)) for r in caplog.records
               if (m := re.fullmatch(r"client gone: stopped after (\d+) tokens", r.getMessage()))]
    assert len(stopped) == 1 and stopped[0] < LONG
    status, _, body = request(port_one, "POST", "/v1/completions", LONG_BODY)  # runs at once, to the end
    assert status == 200 and body["choices"][0]["text"] == "o" * LONG


def test_disconnect_without_streaming_cancels_the_generation(port_one, caplog):
    caplog.set_level(logging.INFO, logger="specrt.serve.app")
    body = json.dumps(LONG_BODY).encode()
    with socket.create_connection(("127.0.0.1", port_one)) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 10
        while not request(port_one, "GET", "/health")[2]["in_flight"]:  # the generation runs
            assert time.monotonic() < deadline
    wait_idle(port_one)
    stopped = [int(m.group(1)) for r in caplog.records
               if (m := re.fullmatch(r"client gone: stopped after (\d+) tokens", r.getMessage()))]
    assert len(stopped) == 1 and stopped[0] < LONG


# --- deadlines ----------------------------------------------------------------------------------

def _answer(out, stream: bool) -> tuple[str, str, list[int]]:
    """(text, finish_reason, token ids) of a completion, streamed or not, from the openai client."""
    if not stream:
        return out.choices[0].text, out.choices[0].finish_reason, out.specrt["token_ids"]
    chunks = list(out)
    last = chunks[-1]
    return "".join(c.choices[0].text for c in chunks), last.choices[0].finish_reason, last.specrt["token_ids"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_deadline_ends_the_answer_with_what_was_generated(model, client, port, stream):
    full = model.generate("hello", method="baseline", max_new_tokens=LONG)
    assert full.finish_reason == "length" and full.text == "o" * LONG
    out = client.completions.create(model="tiny-qwen2", prompt="hello", max_tokens=LONG, temperature=0, stream=stream,
                                    extra_body={"specrt": {"method": "baseline", "timeout_s": 1e-6}})
    text, reason, ids = _answer(out, stream)
    assert reason == "timeout"  # the openai client passes a finish_reason it does not know
    assert len(ids) < LONG and ids == list(full.token_ids[: len(ids)]) and text == "o" * len(ids)
    assert request(port, "GET", "/health")[2]["in_flight"] == 0  # its slot is free
    out = client.completions.create(model="tiny-qwen2", prompt="hello", max_tokens=LONG, temperature=0, stream=stream,
                                    extra_body={"specrt": {"method": "pld", "timeout_s": 60}})
    assert _answer(out, stream) == (full.text, "length", list(full.token_ids))


def test_a_deadline_ends_a_chat_answer(client):
    for stream in (False, True):
        out = client.chat.completions.create(model="tiny-qwen2", max_tokens=LONG, temperature=0, stream=stream,
                                             messages=[{"role": "user", "content": "hello"}],
                                             extra_body={"specrt": {"timeout_s": 1e-6}})
        if stream:
            chunks = list(out)
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            reason = chunks[-1].choices[0].finish_reason
        else:
            text, reason = out.choices[0].message.content, out.choices[0].finish_reason
        assert reason == "timeout" and text == "o" * len(text) and len(text) < LONG


def test_the_server_s_default_deadline_and_a_request_s_own(model):
    config = ServeConfig(model_id="tiny-qwen2", speculation=Speculation("pld", tree=False, draft_budget=8),
                         max_concurrent=2, request_timeout_s=1e-6)
    local = serve_in_thread(build_app(model, config), timeout_s=30)
    try:
        status, _, body = request(local.port, "POST", "/v1/completions", LONG_BODY)
        assert status == 200 and body["choices"][0]["finish_reason"] == "timeout"
        status, _, body = request(local.port, "POST", "/v1/completions",
                                  LONG_BODY | {"specrt": {"method": "baseline", "timeout_s": 60}})
        assert (status, body["choices"][0]["text"], body["choices"][0]["finish_reason"]) == (200, "o" * LONG, "length")
    finally:
        local.stop()


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), "5", True])
def test_request_timeout_must_be_positive_and_finite(model, value):
    config = ServeConfig(model_id="m", speculation=Speculation("pld", tree=False, draft_budget=8), max_concurrent=1,
                         request_timeout_s=value)
    with pytest.raises(specrt.InvalidRequestError, match=r"^request_timeout_s must be a positive finite number"):
        build_app(model, config)


def test_cli_serve_refuses_a_bad_request_timeout(folder):
    out = subprocess.run([sys.executable, "-m", "specrt.cli", "serve", "--model", str(folder),
                          "--request-timeout-s", "0"], capture_output=True, text=True)
    assert out.returncode == 2
    assert "specrt: error: --request-timeout-s must be a positive finite number of seconds, got 0" in out.stderr


def test_cli_serve_starts_and_answers(folder):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "specrt.cli", "serve", "--model", str(folder), "--port", str(port),
                             "--method", "baseline", "--max-concurrent", "2", "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _, health = request(port, "GET", "/health")
                break
            except ConnectionRefusedError:
                assert proc.poll() is None and time.monotonic() < deadline, "specrt serve did not start"
                time.sleep(0.1)
        assert (status, health) == (200, {"status": "ok", "in_flight": 0, "max_concurrent": 2})
        status, _, body = request(port, "POST", "/v1/completions", {"prompt": "hello", "max_tokens": 4,
                                                                     "temperature": 0})
        assert (status, body["choices"][0]["text"], body["specrt"]["method"]) == (200, "oooo", "baseline")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_cli_serve_refuses_an_unknown_default_method(folder):
    out = subprocess.run([sys.executable, "-m", "specrt.cli", "serve", "--model", str(folder), "--method", "nope"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "specrt: error: unknown method 'nope'; valid methods: adapld" in out.stderr


def test_max_concurrent_must_be_positive(model):
    config = ServeConfig(model_id="m", speculation=Speculation("pld", tree=False, draft_budget=8), max_concurrent=0)
    with pytest.raises(specrt.InvalidRequestError, match=r"^max_concurrent must be an int >= 1, got 0$"):
        build_app(model, config)


def test_cli_does_not_import_the_server_stack():
    code = "import sys, specrt.cli; assert 'starlette' not in sys.modules and 'uvicorn' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_cli_serve_default_method_is_the_runtime_default():
    from specrt.cli import _parser
    from specrt.drafters import DEFAULT_METHOD

    assert _parser().parse_args(["serve", "--model", "m"]).method == DEFAULT_METHOD == "auto"
