"""`dllm-bench server` on the `tiny` preset: a real uvicorn server (the CLI in a subprocess, on a
free loopback port) driven by the real `openai` client and by raw HTTP for the error cases."""
from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest

from tests.server_proc import BLOCK, BUDGET_TOKENS, MEMORY, MODEL, Server


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tok():
    from dllm_bench.checkpoints.load import load_tokenizer, model_dir

    return load_tokenizer(model_dir(MODEL))


@pytest.fixture(scope="module")
def local_engine():
    """The server's engine (same preset knobs and budget) in this process."""
    from dllm_bench.server.options import ServerOptions
    from dllm_bench.server.startup import build_state

    state, _ = build_state(ServerOptions(model=MODEL, max_num_batched_tokens=BUDGET_TOKENS, memory_budget=MEMORY,
                                         threads=1, max_waiting=8))
    return state.loop.engine


# ---------------------------------------------------------------- completions
def test_completion_matches_the_in_process_engine(server, tok, local_engine):
    from engine.sampling import SamplingParams

    r = server.client().completions.create(model=MODEL, prompt="Hello there", max_tokens=10,
                                           extra_body={"return_token_ids": True})
    c = r.choices[0]
    prompt = tok("Hello there", add_special_tokens=False)["input_ids"]
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == 16 == len(c.token_ids)      # 10 rounded up to 2 blocks of 8
    assert r.usage.total_tokens == len(prompt) + 16
    assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    assert c.finish_reason in ("stop", "length")
    # The same engine in this process (same preset knobs and budget) decodes the same tokens.
    ref = local_engine.generate([prompt], SamplingParams(gen_length=16, steps=16, block_length=BLOCK))
    assert c.token_ids == ref[0].token_ids


def test_a_list_of_prompts_is_one_choice_each_batched_like_in_process(server, tok, local_engine):
    from engine.sampling import SamplingParams

    texts = ["Hello there", "Count:", "Hello there"]
    before = server.metrics()
    r = server.client().completions.create(model=MODEL, prompt=texts, max_tokens=10,
                                           extra_body={"return_token_ids": True})
    after = server.metrics()
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.prompt_tokens == sum(map(len, prompts))
    assert r.usage.completion_tokens == 3 * 16 == sum(len(c.token_ids) for c in r.choices)
    assert [d["gen_length"] for d in r.model_extra["dllm"]] == [16] * 3     # per prompt, in choice order
    # Admitted together, so batched together: the engine given the same batch in this process
    # decodes the same tokens for each prompt.
    ref = local_engine.generate(prompts, SamplingParams(gen_length=16, steps=16, block_length=BLOCK))
    assert [c.token_ids for c in r.choices] == [o.token_ids for o in ref]
    assert [c.text for c in r.choices] == [tok.decode(o.token_ids, skip_special_tokens=True) for o in ref]
    assert after["dllm_batch_size_max"] >= 3
    assert after["dllm_requests_finished"] - before["dllm_requests_finished"] == 3


def test_a_list_of_token_id_prompts_streams_chunks_tagged_with_their_index(server):
    client = server.client()
    kw = dict(model=MODEL, prompt=[[5, 6, 7], [8, 9], [10]], max_tokens=3 * BLOCK,
              extra_body={"return_token_ids": True})
    whole = client.completions.create(**kw)
    chunks = list(client.completions.create(stream=True, **kw))
    body, last = chunks[:-1], chunks[-1]
    assert all(len(ch.choices) == 1 for ch in body)
    for i, want in enumerate(whole.choices):
        mine = [ch.choices[0] for ch in body if ch.choices[0].index == i]
        assert [len(c.token_ids) for c in mine] == [BLOCK] * 3               # one chunk per block
        assert [c.finish_reason for c in mine] == [None] * 2 + [want.finish_reason]
        assert [t for c in mine for t in c.token_ids] == want.token_ids
    assert last.choices == [] and last.usage.prompt_tokens == 6 == whole.usage.prompt_tokens
    assert last.usage.completion_tokens == 3 * 3 * BLOCK
    assert len({ch.id for ch in chunks}) == 1


def test_a_refused_prompt_refuses_the_whole_list_and_leaves_nothing_behind(server):
    before = server.metrics()
    r = httpx.post(server.url + "/v1/completions", timeout=60,
                   json={"model": MODEL, "prompt": [[1, 2], [3, 4], [1, 2, 502]], "max_tokens": BLOCK})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("prompt[2]: ")
    m = server.wait_metric("dllm_requests_rejected", lambda v: v > before["dllm_requests_rejected"])
    assert m["dllm_requests_rejected"] - before["dllm_requests_rejected"] == 3
    assert m["dllm_requests_running"] == 0 and m["dllm_requests_waiting"] == 0
    assert m["dllm_kv_pool_used_tokens"] == 0
    assert m["dllm_requests_finished"] == before["dllm_requests_finished"]


def test_parallel_decoding_per_request_reports_nfe_and_tpf(server, tok, local_engine):
    from engine.sampling import SamplingParams

    prompt = tok("Hello there", add_special_tokens=False)["input_ids"]
    # Random weights rarely reach a high threshold; a tiny one commits a whole block per forward.
    for extra, decoding in (({"threshold": 1e-4}, "threshold:0.0001"), ({"entropy": 0.0}, "entropy:0"), ({}, "fixed")):
        r = server.client().completions.create(model=MODEL, prompt=prompt, max_tokens=16,
                                               extra_body={"return_token_ids": True, **extra})
        d = r.model_extra["dllm"]
        ref = local_engine.generate([prompt], SamplingParams(gen_length=16, steps=16, block_length=BLOCK,
                                                             decoding=decoding))[0]
        assert d["decoding"] == decoding and r.choices[0].token_ids == ref.token_ids
        assert d["nfe"] == ref.nfe and d["steps_per_block"] == ref.steps_per_block and sum(d["steps_per_block"]) == d["nfe"]
        assert d["tpf"] == 16 / d["nfe"]
    assert d["nfe"] == 16                                     # fixed: one token per forward
    assert r.model_extra["dllm"]["tpf"] == 1.0


def test_threshold_commits_a_block_per_forward_on_confident_proposals(server, tok):
    r = server.client().completions.create(model=MODEL, prompt="Hello there", max_tokens=16,
                                           extra_body={"threshold": 1e-4})
    assert r.model_extra["dllm"]["steps_per_block"] == [1, 1] and r.model_extra["dllm"]["tpf"] == BLOCK
    # JSON's NaN (Python's json reads it) is no threshold either
    r = httpx.post(server.url + "/v1/completions", content=f'{{"model": "{MODEL}", "prompt": "hi", "threshold": NaN}}',
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "threshold" in r.json()["error"]["message"]


def test_chat_completion(server, tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}]
    r = server.client().chat.completions.create(model=MODEL, messages=msgs, max_tokens=BLOCK)
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert r.object == "chat.completion"
    assert r.usage.prompt_tokens == len(tok(text, add_special_tokens=False)["input_ids"])
    assert r.usage.completion_tokens == BLOCK
    assert r.choices[0].message.role == "assistant" and isinstance(r.choices[0].message.content, str)
    assert r.model_extra["dllm"]["nfe"] == BLOCK       # steps = gen_length: one forward per token


@pytest.mark.parametrize("chat", [False, True])
def test_streaming_sends_blocks_in_order_equal_to_the_whole_response(server, chat):
    client = server.client()
    kw = dict(model=MODEL, max_tokens=5 * BLOCK, temperature=0.8, seed=7,
              extra_body={"return_token_ids": True, "steps": 5 * BLOCK})
    if chat:
        call, kw["messages"] = client.chat.completions.create, [{"role": "user", "content": "Count:"}]
    else:
        call, kw["prompt"] = client.completions.create, "Count:"
    whole = call(**kw)
    chunks = list(call(stream=True, **kw))
    body, last = chunks[:-1], chunks[-1]
    assert [len(ch.choices[0].token_ids) for ch in body] == [BLOCK] * 5     # one chunk per block
    assert [ch.choices[0].finish_reason for ch in body] == [None] * 4 + [whole.choices[0].finish_reason]
    ids = [t for ch in body for t in ch.choices[0].token_ids]
    assert ids == whole.choices[0].token_ids                                 # same seed, token for token
    if chat:
        assert body[0].choices[0].delta.role == "assistant"
        assert "".join(ch.choices[0].delta.content for ch in body) == whole.choices[0].message.content
    else:
        assert "".join(ch.choices[0].text for ch in body) == whole.choices[0].text
    assert last.choices == [] and last.usage.completion_tokens == 5 * BLOCK
    assert last.usage.prompt_tokens == whole.usage.prompt_tokens
    assert len({ch.id for ch in chunks}) == 1


def test_concurrent_clients_are_batched_together(server):
    before = server.metrics()
    results: list = [None] * 4

    def one(i: int) -> None:
        results[i] = server.client().completions.create(model=MODEL, prompt=[5 + i, 6, 7], max_tokens=16 * BLOCK)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(r is not None and r.usage.completion_tokens == 16 * BLOCK for r in results)
    after = server.metrics()
    assert after["dllm_batch_size_max"] > 1
    steps = after["dllm_steps"] - before["dllm_steps"]
    batched = after["dllm_batched_requests"] - before["dllm_batched_requests"]
    assert batched / steps > 1                       # fewer steps than four requests one by one
    assert after["dllm_requests_finished"] - before["dllm_requests_finished"] == 4


def test_disconnect_aborts_and_frees_the_kv(server):
    before = server.metrics()
    stream = server.client().completions.create(model=MODEL, prompt=[9, 10, 11], max_tokens=60 * BLOCK,
                                                stream=True)
    first = next(iter(stream))
    assert first.choices[0].finish_reason is None
    m = server.metrics()                 # the first block arrived while the request still runs
    assert m["dllm_requests_running"] == 1 and m["dllm_kv_pool_used_tokens"] > 0
    stream.close()
    m = server.wait_metric("dllm_requests_running", lambda v: v == 0)
    assert m["dllm_requests_aborted"] == before["dllm_requests_aborted"] + 1
    assert m["dllm_requests_finished"] == before["dllm_requests_finished"]
    assert m["dllm_kv_pool_used_tokens"] == 0


def test_disconnect_aborts_every_prompt_of_a_list(server):
    before = server.metrics()
    stream = server.client().completions.create(model=MODEL, prompt=[[9, 10, 11], [12, 13]],
                                                max_tokens=60 * BLOCK, stream=True)
    next(iter(stream))
    stream.close()
    m = server.wait_metric("dllm_requests_running", lambda v: v == 0)
    assert m["dllm_requests_aborted"] == before["dllm_requests_aborted"] + 2
    assert m["dllm_requests_finished"] == before["dllm_requests_finished"]
    assert m["dllm_kv_pool_used_tokens"] == 0


# ---------------------------------------------------------------- bad requests
BAD = [
    ("/v1/completions", {"prompt": [7] * 4200, "max_tokens": 8}, 400,
     "exceeds the model's length of 4096 tokens (max_model_len)"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -4}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "frobnicate": 1}, 400, "frobnicate"),
    ("/v1/completions", {"prompt": "hi", "threshold": 0}, 400, "threshold"),
    ("/v1/completions", {"prompt": "hi", "threshold": 1.5}, 400, "threshold"),
    ("/v1/completions", {"prompt": "hi", "factor": 0}, 400, "factor"),
    ("/v1/completions", {"prompt": "hi", "entropy": -0.5}, 400, "entropy"),
    ("/v1/completions", {"prompt": "hi", "threshold": 0.9, "factor": 1.0}, 400, "give one"),
    ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 16, "steps": 3}, 400, "steps"),
    ("/v1/completions", {"prompt": [1, 2, 502]}, 400, "mask"),
    ("/v1/completions", {"prompt": [1, 2, 99999]}, 400, "token ids"),
    ("/v1/completions", {"prompt": []}, 400, "empty"),
    ("/v1/completions", {"prompt": ["hi", [1, 2]]}, 400, "not mixed"),
    ("/v1/completions", {"prompt": [[1, "a"]]}, 400, "token-id lists"),
    ("/v1/completions", {"prompt": [[1, 2], []]}, 400, "prompt[1]: "),
    ("/v1/completions", {"prompt": [[1, 2], [1, 99999]]}, 400, "token ids"),
    ("/v1/completions", {"prompt": [[1]] * 300}, 400, "at most 256"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    # a field of the wrong JSON type is refused, never coerced (strict request models)
    ("/v1/completions", {"prompt": "hi", "temperature": "0.5"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "8"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 8.0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "seed": "1"}, 400, "seed"),
    ("/v1/completions", {"prompt": "hi", "stream": "false"}, 400, "stream"),
    ("/v1/completions", {"prompt": "hi", "return_token_ids": 1}, 400, "return_token_ids"),
    ("/v1/completions", {"prompt": "hi", "threshold": "0.9"}, 400, "threshold"),
    ("/v1/completions", {"prompt": "hi", "block_length": "32"}, 400, "block_length"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "content"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "gpt-4"),
    ("/v1/nowhere", {"prompt": "hi"}, 404, "Not Found"),
]


@pytest.mark.parametrize("path,body,status,word", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_requests_get_openai_errors(server, path, body, status, word):
    r = httpx.post(server.url + path, json={"model": MODEL, **body} if "model" not in body else body, timeout=60)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert word in err["message"] and err["code"] == status and err["type"]
    assert "Traceback" not in r.text


def test_an_integer_is_a_number_where_the_api_takes_a_float(server):
    # OpenAI's clients send `temperature: 0` and `threshold: 1` as JSON integers: strict types accept them.
    r = httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": BLOCK,
                                                          "temperature": 0, "threshold": 1}, timeout=60)
    assert r.status_code == 200, r.text


def test_malformed_json_and_client_errors_then_the_server_keeps_serving(server):
    r = httpx.post(server.url + "/v1/completions", content=b"{not json", timeout=30,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "error" in r.json()
    client = server.client()
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="hi", max_tokens=BLOCK)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=0)
    r = client.completions.create(model=MODEL, prompt="hi", max_tokens=BLOCK)
    assert r.usage.completion_tokens == BLOCK
    assert httpx.get(server.url + "/health", timeout=30).json() == {"status": "ok"}
    ids = [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]]
    assert ids == [MODEL]


def test_a_request_four_times_the_token_budget_completes_by_default():
    """A server whose token budget is 64 (max_model_len left to the checkpoint's 4096) serves a
    256-token canvas, refreshed in chunks; one over the model's length is a 400 naming it."""
    s = Server(knobs=("--max-num-batched-tokens", "64", "--memory-budget", MEMORY))
    try:
        prompt = [5 + i % 400 for i in range(200)]
        r = s.client().completions.create(model=MODEL, prompt=prompt, max_tokens=56,
                                          extra_body={"return_token_ids": True})
        assert r.usage.prompt_tokens + r.usage.completion_tokens == 256 == 4 * 64
        assert len(r.choices[0].token_ids) == 56
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": [7] * 4090, "max_tokens": 8},
                       timeout=60)
        assert r.status_code == 400
        assert "4098 exceeds the model's length of 4096 tokens (max_model_len)" in r.json()["error"]["message"]
    finally:
        s.stop()


def test_busy_server_answers_503_with_retry_after():
    s = Server("--max-num-seqs", "1", "--max-waiting", "1")
    try:
        long = {"model": MODEL, "max_tokens": 60 * BLOCK, "stream": True}
        with httpx.Client(base_url=s.url, timeout=60) as http:
            with http.stream("POST", "/v1/completions", json={**long, "prompt": [3, 4]}) as a:
                a_lines = a.iter_lines()      # kept: a dropped iterator closes the connection
                next(a_lines)                                         # a runs
                with http.stream("POST", "/v1/completions", json={**long, "prompt": [5, 6]}) as b:
                    assert b.status_code == 200                       # b waits (one seq at a time)
                    s.wait_metric("dllm_requests_waiting", lambda v: v == 1)
                    r = http.post("/v1/completions", json={"model": MODEL, "prompt": [7], "max_tokens": BLOCK})
                    assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
                    assert "busy" in r.json()["error"]["message"]
        s.wait_metric("dllm_requests_running", lambda v: v == 0)
        s.wait_metric("dllm_requests_waiting", lambda v: v == 0)
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL, "prompt": [7], "max_tokens": BLOCK},
                       timeout=60)
        assert r.status_code == 200 and json.loads(r.text)["usage"]["completion_tokens"] == BLOCK
    finally:
        s.stop()
