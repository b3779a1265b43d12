"""A run's draft counts and acceptance alarm where a client reads them: `specscope.metrics` of /v1 answers (whole and a
stream's final chunk, through the official `openai` client), GET /metrics in Prometheus text (counters that add up
the runs made, parsed by prometheus_client's own parser) and `specscope runs ls --json`."""
from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.live_server import serving
from websockets.sync.client import connect

from specscope.backend.cli import main
from specscope.backend.engine.spec_counts import SPEC_KEYS
from specscope.backend.server import create_app
from specscope.backend.store import Store

TOKEN = "sk-metrics-token"
MESSAGES = [{"role": "user", "content": "Reverse: q w e r t y u i"}]
LOOPING = "import os\nimport os\nimport os\n"   # the tiny model repeats it to the end
VARIED = "def fibonacci(n):"
FIXED = {"verify": "fixed"}


@pytest.fixture(scope="module")
def served(loaded, tmp_path_factory) -> Iterator[dict[str, Any]]:
    from specscope.backend.engine.engine import Engine

    db = f"sqlite:///{tmp_path_factory.mktemp('metrics') / 'runs.db'}"
    with serving(create_app(Engine(loaded, num_slots=4096), Store(db), token=TOKEN)) as port:
        url = f"http://127.0.0.1:{port}"
        yield {"url": url, "db": db, "client": openai.OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)}


def get(served: dict[str, Any], path: str) -> httpx.Response:
    answer = httpx.get(f"{served['url']}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
    answer.raise_for_status()
    return answer


def scrape(served: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of GET /metrics, by name and labels, as prometheus_client parses it."""
    text = get(served, "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def check_counts(metrics: dict[str, Any], completion_tokens: int) -> None:
    per_pos = metrics["num_accepted_tokens_per_pos"]
    assert metrics["num_drafts"] > 0 and 0 < metrics["num_accepted_tokens"] <= metrics["num_draft_tokens"]
    assert sum(per_pos) == metrics["num_accepted_tokens"]
    assert all(a >= b for a, b in zip(per_pos, per_pos[1:], strict=False))
    assert metrics["tokens"] == completion_tokens
    assert metrics["tpf"] == pytest.approx(completion_tokens / metrics["nfe"])


def stored_metrics(served: dict[str, Any], run_id: str) -> dict[str, Any]:
    return get(served, f"/api/runs/{run_id}").json()["metrics"]


def test_v1_answers_carry_the_runs_draft_counts(served):
    client = served["client"]
    reply = client.chat.completions.create(model="tiny:isd", messages=MESSAGES, max_tokens=32,
                                           extra_body={"specscope": {"params": FIXED}})
    ext = reply.model_extra["specscope"]
    metrics = ext["metrics"]
    check_counts(metrics, reply.usage.completion_tokens)
    assert metrics["mode"] == "isd" and len(metrics["num_accepted_tokens_per_pos"]) == 3   # n = 4: 3 specs
    assert metrics["alarm"]["flag"] is None
    assert {k: v for k, v in metrics.items() if k != "mode"} == stored_metrics(served, ext["run_id"])

    chunks = list(client.completions.create(model="tiny:linear_spec", prompt=VARIED, max_tokens=40, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"specscope": {"params": {**FIXED, "block_size": 6}}}))
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason][0].model_extra["specscope"]
    streamed = final["metrics"]
    check_counts(streamed, chunks[-1].usage.completion_tokens)
    assert streamed["mode"] == "linear_spec" and len(streamed["num_accepted_tokens_per_pos"]) == 5
    assert all("specscope" not in (c.model_extra or {}) for c in chunks if c.choices and not c.choices[0].finish_reason)


def test_an_ar_answer_counts_no_drafts(served):
    reply = served["client"].completions.create(model="tiny", prompt=VARIED, max_tokens=8)
    metrics = reply.model_extra["specscope"]["metrics"]
    assert {k: metrics[k] for k in SPEC_KEYS} == {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                                                  "num_accepted_tokens_per_pos": []}
    assert metrics["mode"] == "ar" and metrics["nfe"] == reply.usage.completion_tokens - 1   # the prefill's is free
    assert metrics["tpf"] == pytest.approx(reply.usage.completion_tokens / metrics["nfe"])


def test_a_looping_answer_raises_the_alarm(served):
    client = served["client"]
    looping = client.completions.create(model="tiny:linear_spec", prompt=LOOPING, max_tokens=48,
                                        extra_body={"specscope": {"params": FIXED}})
    alarm = looping.model_extra["specscope"]["metrics"]["alarm"]
    assert alarm["flag"] == "loop" and "cycle" in alarm["why"] and alarm["loop"]["threshold"]
    varied = client.completions.create(model="tiny:linear_spec", prompt=VARIED, max_tokens=48,
                                       extra_body={"specscope": {"params": FIXED}})
    assert varied.usage.completion_tokens == 48
    assert varied.model_extra["specscope"]["metrics"]["alarm"]["flag"] is None


def generate_over_ws(served: dict[str, Any], prompt: str, mode: str, params: dict[str, Any]) -> dict[str, Any]:
    """One /ws/generate run: its run_end event."""
    url = served["url"].replace("http", "ws") + f"/ws/generate?token={TOKEN}"
    with connect(url) as ws:
        ws.send(json.dumps({"type": "generate", "prompt": prompt, "mode": mode, "params": params}))
        while (event := json.loads(ws.recv()))["type"] not in ("run_end", "error"):
            pass
    assert event["type"] == "run_end", event
    return event


def test_prometheus_counters_add_up_the_runs(served):
    client = served["client"]
    before = scrape(served)
    runs = [client.completions.create(model=f"tiny:{mode}", prompt=prompt, max_tokens=24,
                                      extra_body={"specscope": {"params": FIXED if mode != "ar" else {}}})
            for mode, prompt in (("isd", VARIED), ("isd", LOOPING), ("linear_spec", LOOPING), ("ar", VARIED))]
    made = [(r.model_extra["specscope"]["metrics"], r.usage.completion_tokens) for r in runs]
    ws_end = generate_over_ws(served, VARIED, "linear_spec", {**FIXED, "raw": True, "max_new_tokens": 24})
    made.append(({"mode": "linear_spec", **ws_end["metrics"]}, len(ws_end["output_ids"])))
    after = scrape(served)   # a run's watch records it before its run_end reaches the client

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"model": "tiny", **labels}.items())))
        return after.get(key, 0) - before.get(key, 0)

    for mode in ("isd", "linear_spec", "ar"):
        mine = [(m, n) for m, n in made if m["mode"] == mode]
        assert delta("specscope:requests_total", mode=mode, status="done") == len(mine)
        assert delta("specscope:generation_tokens_total", mode=mode) == sum(n for _, n in mine)
        assert delta("specscope:e2e_request_latency_seconds_count", mode=mode) == len(mine)
        assert delta("specscope:e2e_request_latency_seconds_sum", mode=mode) > 0
        for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            assert delta(f"specscope:spec_decode_{key}_total", mode=mode) == sum(m[key] for m, _ in mine)
        per_pos = [m["num_accepted_tokens_per_pos"] for m, _ in mine]
        for position in range(max(map(len, per_pos))):
            assert delta("specscope:spec_decode_num_accepted_tokens_per_pos_total", mode=mode,
                         position=str(position)) == sum(p[position] for p in per_pos if position < len(p))
    assert delta("specscope:spec_decode_num_drafts_total", mode="isd") > 0
    loops = sum(m["alarm"]["flag"] == "loop" for m, _ in made)
    assert loops >= 2 and delta("specscope:spec_alarms_total", mode="isd", flag="loop") + delta(
        "specscope:spec_alarms_total", mode="linear_spec", flag="loop") == loops


def test_metrics_need_the_token_and_each_server_has_its_own(served, loaded, tmp_path):
    assert httpx.get(f"{served['url']}/metrics").status_code == 401
    from specscope.backend.engine.engine import Engine

    with serving(create_app(Engine(loaded, num_slots=1024), Store(f"sqlite:///{tmp_path / 'b.db'}"))) as port:
        fresh = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert fresh.status_code == 200 and fresh.headers["content-type"].startswith("text/plain")
    samples = [s for f in text_string_to_metric_families(fresh.text) for s in f.samples]
    assert not any(s.name == "specscope:requests_total" for s in samples)   # no run of the other server's


def test_runs_json_lists_each_runs_counts_and_alarm(served, capsys):
    reply = served["client"].completions.create(model="tiny:linear_spec", prompt=LOOPING, max_tokens=32,
                                                extra_body={"specscope": {"params": FIXED}})
    run_id = reply.model_extra["specscope"]["run_id"]
    get(served, f"/api/runs/{run_id}")       # a read waits until the writer has stored the run
    assert main(["runs", "ls", "--json", "--db", served["db"]]) == 0
    runs = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    listed = runs[run_id]["metrics"]
    answered = reply.model_extra["specscope"]["metrics"]
    assert {k: listed[k] for k in SPEC_KEYS} == {k: answered[k] for k in SPEC_KEYS}
    assert listed["alarm"] == answered["alarm"] and listed["alarm"]["flag"] == "loop"
    assert runs[run_id]["mode"] == "linear_spec"
