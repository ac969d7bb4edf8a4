"""`specgraft serve`: a real uvicorn server on 127.0.0.1 with a tiny model, talked to with the
official ``openai`` client and raw HTTP. Every client call has a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Iterator

import httpx
import openai
import pytest

from specgraft.api import SpecDecoder
from specgraft.serve import ServerConfig
from specgraft.serve.metrics import parse

from tests.helpers.cli import run_cli
from tests.helpers.models import tiny_llama, tiny_tokenizer
from tests.helpers.scripts import ROOT
from tests.helpers.server import TIMEOUT, running_server

pytestmark = pytest.mark.usefixtures("one_thread")

MODEL = "tiny"
# a request long enough to be still running when the test acts on it (the tiny context is 512)
LONG = {"max_tokens": 500, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    with running_server(ServerConfig(model_name=MODEL, max_batch=4, max_queue=64)) as (url, app):
        yield url, app


@pytest.fixture
def client(server):
    url, _ = server
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0)


@pytest.fixture
def http(server):
    url, _ = server
    with httpx.Client(base_url=url, timeout=TIMEOUT) as c:
        yield c


@pytest.fixture(scope="module")
def reference():
    """The same weights decoded alone with plain greedy decoding (``ar``)."""
    return SpecDecoder(tiny_llama(), tiny_tokenizer(), method="ar")


def metrics(http: httpx.Client) -> dict[str, float]:
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return parse(r.text)


def wait_until(condition, what: str, timeout: float = TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def sse_data(lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        if line:
            assert line.startswith("data: "), line
            yield line[len("data: "):]


# -- the openai client ----------------------------------------------------------------------


def test_models_and_health(client, http):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert http.get("/health").json()["status"] == "ok"


def test_completion_equals_plain_decoding(client, reference):
    prompt = "w5 w6 w7 w5 w6 w7 w5 w6"
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    ref = reference.generate(prompt, max_new_tokens=24)
    choice = out.choices[0]
    assert choice.text == ref.text and choice.finish_reason == ref.finish_reason
    assert out.usage.prompt_tokens == len(reference.encode(prompt)) and out.usage.completion_tokens == len(ref.tokens)
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_streamed_completion_equals_response(client):
    kw = dict(model=MODEL, prompt="w9 w10 w11 w9 w10", max_tokens=20, temperature=0)
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


def test_chat_completion_uses_the_template_over_all_messages(client, reference):
    messages = [
        {"role": "system", "content": "w20 w21"},
        {"role": "user", "content": "w5 w6 w7 w5 w6"},
        {"role": "assistant", "content": "w8"},
        {"role": "user", "content": [{"type": "text", "text": "w9 w5 w6"}]},
    ]
    as_text = messages[:-1] + [{"role": "user", "content": "w9 w5 w6"}]
    ids = reference.encode_messages(as_text)
    ref = reference.generate(ids, max_new_tokens=16)
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].message.content == ref.text and out.choices[0].finish_reason == ref.finish_reason
    assert out.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref.text
    assert chunks[-1].choices[0].finish_reason == ref.finish_reason and chunks[-1].usage is None


def test_stop_strings_end_the_text_before_them(client, reference):
    prompt = "w5 w6 w7 w5 w6 w7 w5 w6"
    words = reference.generate(prompt, max_new_tokens=24).text.split()
    stop = words[3]
    expected = reference.generate(prompt, max_new_tokens=24, stop=[stop, "w95 w95"])
    for stops in ([stop, "w95 w95"], stop):
        out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=stops)
        assert out.choices[0].text == expected.text and out.choices[0].finish_reason == "stop"
        assert stop not in out.choices[0].text
        assert out.usage.completion_tokens == len(expected.tokens)
        chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=stops, stream=True))
        assert "".join(c.choices[0].text for c in chunks) == expected.text
        assert chunks[-1].choices[0].finish_reason == "stop"


def test_sampling_follows_the_seed(client):
    kw = dict(model=MODEL, prompt="w5 w6 w7", max_tokens=16, temperature=0.9, top_p=0.9, seed=3)
    first, second = (client.completions.create(**kw).choices[0].text for _ in range(2))
    assert first == second


def test_the_client_raises_on_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="w5", max_tokens=4)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=MODEL, prompt="w5", max_tokens=4, n=2)
    assert e.value.body["param"] == "n"


# -- raw HTTP: every bad request gets an OpenAI error with a 4xx -------------------------------

TOO_LONG = " ".join(["w5"] * 600)


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/v1/completions", "{not json", 400, None),
        ("/v1/completions", "[1, 2]", 400, None),
        ("/v1/completions", {"prompt": "w5"}, 400, "model"),
        ("/v1/completions", {"model": MODEL}, 400, "prompt"),
        ("/v1/chat/completions", {"model": MODEL}, 400, "messages"),
        ("/v1/completions", {"model": "gpt-4", "prompt": "w5"}, 404, "model"),
        ("/v1/completions", {"model": MODEL, "prompt": "w5", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "w5", "max_tokens": 512}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "w5", "max_tokens": "many"}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": TOO_LONG, "max_tokens": 4}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": TOO_LONG}, 400, "prompt"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": TOO_LONG}]}, 400, "messages"),
        ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": ["w5", "w6"]}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": [5, 100000]}, 400, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": "w5", "temperature": -0.1}, 400, "temperature"),
        ("/v1/completions", {"model": MODEL, "prompt": "w5", "top_p": 0}, 400, "top_p"),
        ("/v1/completions", {"model": MODEL, "prompt": "w5", "top_p": 1.5}, 400, "top_p"),
        ("/v1/completions", {"model": MODEL, "prompt": "w5", "n": 2}, 400, "n"),
        ("/v1/completions", {"model": MODEL, "prompt": "w5", "stop": [""]}, 400, "stop"),
        ("/v1/completions", {"model": MODEL, "prompt": "w5", "logprobs": 2}, 400, "logprobs"),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "w5"}]}, 400, "messages[0].role"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "w5"}], "n": 3, "stream": True}, 400, "n"),
    ],
)
def test_bad_requests_get_openai_errors(http, path, body, status, param):
    before = metrics(http)
    content = body if isinstance(body, str) else json.dumps(body)
    r = http.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == param
    after = metrics(http)
    assert after['specgraft_requests_total{outcome="invalid"}'] == before['specgraft_requests_total{outcome="invalid"}'] + 1
    assert http.get("/health").status_code == 200


USER = [{"role": "user", "content": "w5"}]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 4000}}

# (endpoint, fields beside model and prompt/messages, param, words the message must contain)
NAMED_BAD_VALUES = [
    ("completions", {"max_tokens": True}, "max_tokens", "max_tokens: Input should be a valid integer (got True)"),
    ("completions", {"max_tokens": 4.0}, "max_tokens", "valid integer"),
    ("chat", {"max_completion_tokens": True}, "max_completion_tokens", "max_completion_tokens: Input should be a valid integer"),
    ("chat", {"max_completion_tokens": 0}, "max_completion_tokens", "greater than or equal to 1"),
    ("completions", {"temperature": 2.5}, "temperature", "temperature: Input should be less than or equal to 2 (got 2.5)"),
    ("completions", {"temperature": True}, "temperature", "valid number"),
    ("completions", {"seed": 2**64}, "seed", f"seed: Input should be less than {2**63} (got {2**64})"),
    ("completions", {"seed": 2**63}, "seed", "less than"),
    ("chat", {"seed": -1}, "seed", "greater than or equal to 0"),
    ("completions", {"n": True}, "n", "n: Input should be a valid integer"),
    ("completions", {"n": 0}, "n", "greater than or equal to 1"),
    ("completions", {"top_p": 1.01}, "top_p", "less than or equal to 1"),
    ("completions", {"top_k": -1}, "top_k", "greater than or equal to 0"),
    ("chat", {"messages": [{"role": "user"}]}, "messages[0].content", "messages[0].content: a user message needs text, got no content"),
    ("chat", {"messages": [{"role": "user", "content": None}]}, "messages[0].content", "got null"),
    ("chat", {"messages": [{"role": "user", "content": ""}]}, "messages[0].content", "got an empty string"),
    ("chat", {"messages": [{"role": "user", "content": []}]}, "messages[0].content", "got an empty list of parts"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": ""}]}]}, "messages[0].content", "only empty text parts"),
    ("chat", {"messages": [{"role": "system", "content": "w5"}, {"role": "user", "content": [{"type": "text", "text": "w6"}, IMAGE]}]},
     "messages[1].content", "messages[1].content: only text parts are supported, got an 'image_url' part"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "content must be a string or a list of text parts, got a number"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content", "text must be a string, got a number"),
]


@pytest.mark.parametrize("endpoint, fields, param, words", NAMED_BAD_VALUES, ids=[f"{e}-{p}-{i}" for i, (e, _, p, _) in enumerate(NAMED_BAD_VALUES)])
def test_bad_values_are_400s_naming_the_field(client, http, endpoint, fields, param, words):
    """Through raw HTTP and the openai client: a 400 whose message names the field in words
    (``messages[0].content``, not pydantic's ``messages.0.content.str``) and what was wrong; never
    a 500 (a seed of 2**64 was one: "Overflow when unpacking long long"); a bool is not a number."""
    body = {"model": MODEL, "max_tokens": 4, **({"messages": USER} if endpoint == "chat" else {"prompt": "w5"}), **fields}
    if "max_completion_tokens" in fields:
        del body["max_tokens"]
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"] and error["type"] == "invalid_request_error", error
    assert ".str" not in error["message"] and len(error["message"]) < 200, "no union member names, no echoed image"

    create = client.chat.completions.create if endpoint == "chat" else client.completions.create
    extensions = {k: body.pop(k) for k in ("top_k",) if k in body}  # not OpenAI's: the client sends them as extra_body
    with pytest.raises(openai.BadRequestError) as e:
        create(**body, extra_body=extensions)
    assert e.value.status_code == 400 and e.value.body["param"] == param and words in e.value.body["message"]


def test_the_largest_seed_is_served(client, http):
    kw = dict(model=MODEL, prompt="w5 w6 w7", max_tokens=4, temperature=0.9)
    assert client.completions.create(seed=2**63 - 1, **kw).usage.completion_tokens >= 1
    assert http.post("/v1/completions", json={**kw, "seed": 0}).status_code == 200


def test_unknown_routes_and_methods_are_openai_errors(http):
    r = http.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["message"]
    r = http.get("/v1/completions")
    assert r.status_code == 405 and r.json()["error"]["message"]


# -- concurrency, disconnects, a full queue ------------------------------------------------


def requests_16(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(16):
        words = [f"w{rng.randrange(3, 40)}" for _ in range(rng.randrange(2, 30))]
        body = {"model": MODEL, "max_tokens": rng.randrange(4, 40), "temperature": 0}
        if i % 2:
            body["messages"] = [{"role": "user", "content": " ".join(words)}]
        else:
            body["prompt"] = " ".join(words)
        if i % 5 == 0:
            body["stop"] = ["w7", "w30 w31"]
        out.append(body)
    return out


async def stream_one(client: openai.AsyncOpenAI, body: dict) -> tuple[str, str, int, int, set[str]]:
    """(text, finish reason, prompt tokens, completion tokens, chunk ids) of one streamed request."""
    kw = dict(body)
    if "messages" in kw:
        stream = await client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
        pick = lambda c: c.choices[0].delta.content or ""  # noqa: E731
    else:
        stream = await client.completions.create(stream=True, stream_options={"include_usage": True}, **kw)
        pick = lambda c: c.choices[0].text  # noqa: E731
    text, reason, usage, ids = [], None, None, set()
    async for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        if chunk.choices:
            text.append(pick(chunk))
            reason = chunk.choices[0].finish_reason or reason
    return "".join(text), reason, usage.prompt_tokens, usage.completion_tokens, ids


def test_16_concurrent_streams_equal_each_served_alone(server, http):
    url, app = server
    bodies = requests_16()

    async def alone_then_together():
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", timeout=TIMEOUT, max_retries=0) as client:
            alone = [await asyncio.wait_for(stream_one(client, b), TIMEOUT) for b in bodies]
            before = metrics(http)
            together = await asyncio.wait_for(asyncio.gather(*(stream_one(client, b) for b in bodies)), 4 * TIMEOUT)
            return alone, before, together

    alone, before, together = asyncio.run(alone_then_together())
    after = metrics(http)
    for i, (a, t) in enumerate(zip(alone, together, strict=True)):
        assert t[:4] == a[:4], f"request {i} differs when batched"
        assert len(t[4]) == 1, f"request {i}'s chunks carry several ids"
    assert len(set().union(*(t[4] for t in together))) == 16, "responses lost or duplicated"
    assert {t[1] for t in together} <= {"stop", "length"}

    def delta(key: str) -> float:
        return after[key] - before[key]

    outcomes = {o: delta(f'specgraft_requests_total{{outcome="{o}"}}') for o in ("stop", "length", "cancelled", "error", "queue_full")}
    assert outcomes["stop"] + outcomes["length"] == 16 and outcomes["cancelled"] == outcomes["error"] == outcomes["queue_full"] == 0
    assert outcomes["stop"] == sum(t[1] == "stop" for t in together)
    assert delta("specgraft_generation_tokens_total") == sum(t[3] for t in together)
    assert delta("specgraft_prompt_tokens_total") == sum(t[2] for t in together)
    assert delta("specgraft_step_seconds_count") == delta("specgraft_steps_total") > 0
    # batches of more than one sequence did happen, and never more than max_batch
    assert delta('specgraft_batch_size_bucket{le="1"}') < delta("specgraft_batch_size_count")
    assert delta('specgraft_batch_size_bucket{le="4"}') == delta("specgraft_batch_size_count")
    assert delta("specgraft_batch_size_sum") == delta("specgraft_sequence_steps_total")
    assert after["specgraft_running_requests"] == after["specgraft_waiting_requests"] == 0
    mat = after['specgraft_mean_accepted_tokens_per_step{method="pld"}']
    assert mat == after['specgraft_request_tokens_total{method="pld"}'] / after['specgraft_request_steps_total{method="pld"}'] >= 1
    assert sum(v for k, v in after.items() if k.startswith("specgraft_proposed_nodes_total{")) > 0
    assert app.state.worker.batch.num_running == 0


def test_a_client_that_disconnects_frees_its_slot(server, http, monkeypatch):
    url, app = server
    before = metrics(http)
    # every step takes >= 20 ms, so the 500 tokens are still running when the first chunk is read,
    # even on a busy machine where the tiny model's steps alone could finish them first
    batch = app.state.worker.batch
    step = batch.step
    monkeypatch.setattr(batch, "step", lambda: (time.sleep(0.02), step())[1])
    with http.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": "w5 w6", "stream": True, **LONG}) as r:
        assert r.status_code == 200
        first = json.loads(next(sse_data(r.iter_lines())))
        assert first["choices"][0]["text"]
        assert app.state.worker.batch.num_running == 1
    # the response is closed mid-stream: the request is cancelled and its slot freed
    wait_until(lambda: app.state.worker.batch.num_running == 0, "the slot to be freed")
    wait_until(lambda: metrics(http)['specgraft_requests_total{outcome="cancelled"}'] == before['specgraft_requests_total{outcome="cancelled"}'] + 1,
               "the cancellation to be counted")
    after = metrics(http)
    assert after['specgraft_requests_total{outcome="length"}'] == before['specgraft_requests_total{outcome="length"}']
    assert http.get("/health").json() == {"status": "ok", "running": 0, "waiting": 0}


def test_a_client_that_gives_up_on_a_response_frees_its_slot(server, http, monkeypatch):
    url, app = server
    before = metrics(http)['specgraft_requests_total{outcome="cancelled"}']
    # every step takes >= 10 ms, so the 500 tokens outlast the client's 0.3 s however well pld drafts
    batch = app.state.worker.batch
    step = batch.step
    monkeypatch.setattr(batch, "step", lambda: (time.sleep(0.01), step())[1])
    with httpx.Client(base_url=url, timeout=httpx.Timeout(TIMEOUT, read=0.3)) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/completions", json={"model": MODEL, "prompt": "w5 w6", **LONG})
    wait_until(lambda: metrics(http)['specgraft_requests_total{outcome="cancelled"}'] == before + 1, "the request to be cancelled")
    wait_until(lambda: app.state.worker.batch.num_running == 0, "the slot to be freed")


def test_a_full_queue_answers_429():
    with running_server(ServerConfig(model_name=MODEL, max_batch=1, max_queue=1)) as (url, app):
        batch = app.state.worker.batch
        with httpx.Client(base_url=url, timeout=TIMEOUT) as http:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "w5"}], "stream": True, **LONG}
            with http.stream("POST", "/v1/chat/completions", json=body) as running:
                lines = sse_data(running.iter_lines())
                next(lines), next(lines)  # the role chunk, then text: it is running
                with http.stream("POST", "/v1/chat/completions", json=body) as waiting:
                    assert waiting.status_code == 200
                    wait_until(lambda: batch.num_running == 1 and batch.num_waiting == 1, "one running, one waiting")
                    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "w5", "max_tokens": 4})
                    assert r.status_code == 429, r.text
                    assert r.json()["error"]["code"] == "queue_full"
            wait_until(lambda: batch.num_running == 0 and batch.num_waiting == 0, "both requests to be cancelled")
            m = metrics(http)
            assert m['specgraft_requests_total{outcome="queue_full"}'] == 1
            assert m['specgraft_requests_total{outcome="cancelled"}'] == 2
            # the queue has room again
            r = http.post("/v1/completions", json={"model": MODEL, "prompt": "w5", "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1


# -- the command line ------------------------------------------------------------------------


def test_serve_refuses_bad_options(monkeypatch, capsys, tiny_model_dir):
    code, _, err = run_cli(monkeypatch, capsys, "serve", "--model", tiny_model_dir, "--method", "nope")
    assert code == 2 and "unknown method 'nope'" in err
    code, _, err = run_cli(monkeypatch, capsys, "serve", "--model", tiny_model_dir, "--max-batch", "0")
    assert code == 2 and "max_batch must be an integer >= 1, got 0" in err


@pytest.mark.parametrize("sig, grace, last", [(signal.SIGTERM, 0, "error"), (signal.SIGINT, 60, "length")])
def test_serve_command_shuts_down_cleanly(tiny_model_dir, sig, grace, last):
    """`specgraft serve` in a subprocess, a stream in flight, then SIGTERM or SIGINT: the stream
    is cancelled at once (grace 0: an error event, then ``[DONE]``) or finishes (a long grace),
    the worker stops and the process exits 0 without a traceback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    # `ar`: one token a step, so the 500-token stream is still running when the signal lands (with
    # `pld` on the tiny model's repetitive text it could finish first: a flaky test)
    cmd = [sys.executable, "-m", "specgraft.cli", "serve", "--model", tiny_model_dir, "--method", "ar", "--port", str(port),
           "--max-batch", "2", "--threads", "1", "--shutdown-timeout", str(grace), "--served-model-name", MODEL]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT) as http:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, "the server did not come up"
                with contextlib.suppress(httpx.TransportError):
                    if http.get("/health").status_code == 200:
                        break
                time.sleep(0.2)
            seen: list[str] = []
            ended = threading.Event()

            def consume():
                body = {"model": MODEL, "prompt": "w5", "stream": True, "stream_options": {"include_usage": True}, **LONG}
                with http.stream("POST", "/v1/completions", json=body) as r:
                    seen.extend(sse_data(r.iter_lines()))
                ended.set()

            reader = threading.Thread(target=consume, daemon=True)
            reader.start()
            wait_until(lambda: len(seen) >= 2, "the stream to start")
            proc.send_signal(sig)
            _, err = proc.communicate(timeout=90)
            assert ended.wait(TIMEOUT), "the stream hung"
        assert proc.returncode == 0, err
        assert "Traceback" not in err, err
        assert "specgraft serve: tiny" in err and "model worker stopped" in err and "Application shutdown complete" in err, err
        startup = next(line for line in err.splitlines() if line.startswith("specgraft serve: tiny"))
        assert re.search(r", (float32|bfloat16) on (cpu|cuda)", startup) and "auto" not in startup, "the resolved dtype"
        assert seen[-1] == "[DONE]"
        if last == "error":
            assert "shutting down" in json.loads(seen[-2])["error"]["message"]
        else:
            assert json.loads(seen[-3])["choices"][0]["finish_reason"] == "length"
            assert json.loads(seen[-2])["usage"]["completion_tokens"] == LONG["max_tokens"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
