"""The OpenAI-compatible /v1 API through the official `openai` client against a real uvicorn server: answers equal
the engine's own runs, streaming equals whole, every request is a stored run, modes come from the model id or
the extension field, and errors have OpenAI's classes and status codes."""
from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from support.live_server import serving
from support.modes import LONG_RAW_PROMPT

from specscope.backend.server import create_app
from specscope.backend.store import Store

TOKEN = "sk-test-token"
MESSAGES = [{"role": "user", "content": "What is 12 + 30?"}]


@pytest.fixture(scope="module")
def served(loaded, tmp_path_factory) -> Iterator[dict[str, Any]]:
    from specscope.backend.engine.engine import Engine

    engine = Engine(loaded, num_slots=4096, check_invariants=True)
    reference = Engine(loaded, num_slots=4096)
    store = Store(f"sqlite:///{tmp_path_factory.mktemp('v1') / 'runs.db'}")
    with serving(create_app(engine, store, token=TOKEN)) as port:
        url = f"http://127.0.0.1:{port}"
        yield {"url": url, "engine": engine, "reference": reference,
               "client": openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)}


def rest(served: dict[str, Any], path: str) -> Any:
    answer = httpx.get(f"{served['url']}/api{path}", headers={"Authorization": f"Bearer {TOKEN}"})
    answer.raise_for_status()
    return answer.json()


def wait_idle(served: dict[str, Any]) -> dict[str, Any]:
    """/api/health once no run is active (a cancelled run ends within a round)."""
    for _ in range(200):
        health = rest(served, "/health")
        if health["active_runs"] == 0:
            return health
        time.sleep(0.05)
    raise AssertionError(f"runs still active: {health}")


def test_models_lists_the_served_model_and_one_id_per_mode(served):
    ids = [m.id for m in served["client"].models.list()]
    modes = [m["name"] for m in rest(served, "/modes") if m["available"]]
    assert ids == ["tiny", *(f"tiny:{m}" for m in modes)]
    assert [served["client"].models.retrieve(i).id for i in ids] == ids
    with pytest.raises(openai.NotFoundError, match="not served here"):
        served["client"].models.retrieve("gpt-4")
    with pytest.raises(openai.NotFoundError):
        served["client"].models.retrieve("tiny:no_such_mode")


def test_chat_completion_is_the_engines_answer_and_a_stored_run(served):
    raw = served["client"].chat.completions.with_raw_response.create(model="tiny", messages=MESSAGES, max_tokens=12)
    reply = raw.parse()
    expected = served["reference"].generate(MESSAGES, "ar", {"max_new_tokens": 12})
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].message.role == "assistant"
    run_id = raw.headers["x-specscope-run-id"]
    assert reply.model_extra["specscope"]["run_id"] == run_id and reply.id == f"chatcmpl-{run_id}"
    assert reply.usage.completion_tokens == len(expected.output_ids)
    assert reply.choices[0].finish_reason == ("length" if len(expected.output_ids) == 12 else "stop")
    run = rest(served, f"/runs/{run_id}")
    assert (run["mode"], run["status"], run["output"]) == ("ar", "done", expected.text)
    assert served["engine"].rt.pool.used == 0


def test_streamed_chunks_spell_the_whole_answer_and_end_with_usage(served):
    client = served["client"]
    whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=16, seed=3,
                                           temperature=0.8)
    chunks = list(client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=16, seed=3,
                                                 temperature=0.8, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content and len(chunks) > 3
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert len({c.id for c in chunks}) == 1 and chunks[0].id != whole.id   # two runs, one id per run


@pytest.mark.parametrize("how", ["model id", "extension"])
def test_mode_from_the_model_id_or_the_extension_field(served, how):
    client = served["client"]
    kwargs: dict[str, Any] = ({"model": "tiny:linear_spec"} if how == "model id" else
                              {"model": "tiny", "extra_body": {"specscope": {"mode": "linear_spec",
                                                                             "params": {"block_size": 4}}}})
    reply = client.chat.completions.create(messages=MESSAGES, max_tokens=12, **kwargs)
    run = rest(served, f"/runs/{reply.model_extra['specscope']['run_id']}")
    assert run["mode"] == "linear_spec"
    if how == "extension":
        assert run["params"]["block_size"] == 4   # the extension's mode parameters reach the run
    ar = served["reference"].generate(MESSAGES, "ar", {"max_new_tokens": 12}).text
    assert reply.choices[0].message.content == ar   # linear_spec is lossless vs ar


def test_text_completion_continues_the_raw_prompt(served):
    prompt = "def add(a, b):\n    "
    reply = served["client"].completions.create(model="tiny", prompt=prompt, max_tokens=10)
    expected = served["reference"].generate(prompt, "ar", {"max_new_tokens": 10, "raw": True}).text
    assert reply.choices[0].text == expected and reply.object == "text_completion"
    streamed = served["client"].completions.create(model="tiny", prompt=prompt, max_tokens=10, stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected


def test_stop_strings_cut_the_answer_and_end_its_run(served):
    client = served["client"]
    full = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop.strip(), f"pick another stop in {full!r}"
    for stream in (False, True):
        reply = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, stop=[stop],
                                               stream=stream)
        if stream:
            chunks = list(reply)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            text, finish = reply.choices[0].message.content, reply.choices[0].finish_reason
        assert text == full[:full.index(stop)] and finish == "stop"
    wait_idle(served)
    assert served["engine"].rt.pool.used == 0


def test_errors_have_openais_classes_and_status_codes(served):
    client = served["client"]
    with pytest.raises(openai.NotFoundError, match="not served"):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=-1)
    with pytest.raises(openai.BadRequestError, match=r"400 - n: 2 is not supported \(only 1\)") as n:
        client.chat.completions.create(model="tiny", messages=MESSAGES, n=2)
    assert n.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError, match="top_p: 0.5 is not supported") as top_p:
        client.chat.completions.create(model="tiny", messages=MESSAGES, top_p=0.5, presence_penalty=0)
    assert top_p.value.body["param"] == "top_p"
    with pytest.raises(openai.BadRequestError, match="unknown mode|no mode"):
        client.chat.completions.create(model="tiny:nosuchmode", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="last message"):
        client.chat.completions.create(model="tiny", messages=[{"role": "assistant", "content": "hi"}])
    with pytest.raises(openai.APIStatusError, match="context") as too_long:
        client.completions.create(model="tiny", prompt="word " * 3000, max_tokens=4)
    assert too_long.value.status_code == 413
    with pytest.raises(openai.APIStatusError) as too_big:
        client.completions.create(model="tiny", prompt="x" * 300_000)
    assert too_big.value.status_code == 413
    wrong = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.chat.completions.create(model="tiny", messages=MESSAGES)
    assert refused.value.body["code"] == "invalid_api_key"
    assert client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2).choices   # still serving


def test_a_full_server_answers_429(loaded, tmp_path):
    from specscope.backend.engine.engine import Engine

    app = create_app(Engine(loaded, num_slots=4096), Store(f"sqlite:///{tmp_path / 'runs.db'}"),
                     max_queued=0)
    with serving(app) as port:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
        with pytest.raises(openai.RateLimitError, match="limit"):
            client.chat.completions.create(model="tiny", messages=MESSAGES)


def test_a_client_that_leaves_mid_stream_leaves_nothing_running(served):
    # ~2.3 s of block_diffusion: the client always leaves mid-run
    stream = served["client"].completions.create(model="tiny:block_diffusion", prompt=LONG_RAW_PROMPT,
                                                 max_tokens=512, stream=True)
    first = next(iter(stream))
    stream.close()
    run_id = first.id.removeprefix("cmpl-")
    wait_idle(served)
    assert rest(served, f"/runs/{run_id}")["status"] == "cancelled"
    assert served["engine"].rt.pool.used == 0


def test_a_batch_of_requests_are_all_stored_runs(served):
    prompts = [f"Count from 1 to {n}." for n in range(3, 9)]
    ids = [served["client"].chat.completions.create(model="tiny:isd", max_tokens=8,
                                                    messages=[{"role": "user", "content": p}]).id for p in prompts]
    runs = {r["run_id"]: r for r in rest(served, "/runs?limit=200")}
    assert all(i.removeprefix("chatcmpl-") in runs for i in ids)
    assert [runs[i.removeprefix("chatcmpl-")]["prompt"] for i in ids] == prompts
