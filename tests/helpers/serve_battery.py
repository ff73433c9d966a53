"""A battery of malformed and edge-case requests for the rollout server (`srt-agent serve`): numbers out of
vLLM's bounds, wrong types, broken bodies. Each must get a 4xx naming the problem, or a sensible 200; never a
500, and the server must serve normally after it.

    python tests/helpers/serve_battery.py http://127.0.0.1:8000 MODEL_NAME   # prints one line per request, JSON last
"""

from __future__ import annotations

import json
import sys

import httpx

BIG = 2**80


def battery(model: str) -> list[tuple[str, str, dict | bytes]]:
    """(name, path, JSON body or raw bytes) of every request in the battery."""
    chat = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
    completion = {"model": model, "prompt": "Once upon a time", "max_tokens": 4}
    items: list[tuple[str, str, dict | bytes]] = []
    for field, values in {
        "seed": [BIG, -BIG, 2**63, -(2**63) - 1, "7", 1.5],
        "top_k": [BIG, -5, 10**6],
        "temperature": [-1, 3.0, 1e308, "hot"],
        "top_p": [0, 2, -0.5],
        "max_tokens": [0, -1, BIG, 10**9],
        "stop_token_ids": [[BIG], [-1], [10**9], "x"],
        "n": [0, 2, BIG],
        "presence_penalty": [5, 1],
        "frequency_penalty": [-3],
        "repetition_penalty": [0, -1, 1.5],
        "logit_bias": [{"1": 100}],
        "stop": [123, [""], ["x"] * 3],
        "top_logprobs": [50, -1, 5],
    }.items():
        for value in values:
            body = {**chat, field: value}
            if field == "top_logprobs":
                body["logprobs"] = True
            items.append((f"chat {field}={value!r:.40}", "/v1/chat/completions", body))
    for name, messages in {
        "not a list": "hi",
        "empty": [],
        "no content": [{"role": "user"}],
        "number content": [{"role": "user", "content": 123}],
        "unknown role": [{"role": "wizard", "content": "x"}],
        "not objects": ["hi"],
    }.items():
        items.append((f"chat messages {name}", "/v1/chat/completions", {**chat, "messages": messages}))
    for name, prompt in {
        "ids past the vocabulary": [10**9],
        "negative id": [-1],
        "huge id": [BIG],
        "empty": [],
        "empty string": "",
        "two prompts": ["a", "b"],
        "nested junk": [[1, "x"]],
    }.items():
        items.append((f"completion prompt {name}", "/v1/completions", {**completion, "prompt": prompt}))
    items += [
        ("completion logprobs=99", "/v1/completions", {**completion, "logprobs": 99}),
        ("completion echo", "/v1/completions", {**completion, "echo": True}),
        ("completion best_of=0", "/v1/completions", {**completion, "best_of": 0}),
        ("chat stream seed=2**80", "/v1/chat/completions", {**chat, "stream": True, "seed": BIG}),
        ("chat wrong model", "/v1/chat/completions", {**chat, "model": "nope"}),
        ("chat no model", "/v1/chat/completions", {k: v for k, v in chat.items() if k != "model"}),
        ("chat temperature NaN", "/v1/chat/completions", json.dumps(chat)[:-1].encode() + b', "temperature": NaN}'),
        ("chat top_p Infinity", "/v1/chat/completions", json.dumps(chat)[:-1].encode() + b', "top_p": Infinity}'),
        ("not JSON", "/v1/chat/completions", b"{model: x"),
        ("a JSON array", "/v1/chat/completions", b"[1, 2]"),
        ("not UTF-8", "/v1/chat/completions", b'{"model": "\xff\xfe"}'),
        ("session unknown, delete", "/sessions/none/v1/chat/completions", {**chat, "seed": BIG}),
    ]
    return items


def run_battery(url: str, model: str) -> list[dict]:
    """Send every request; returns {name, status, detail} for each."""
    answers = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for name, path, body in battery(model):
            if isinstance(body, bytes):
                response = client.post(path, content=body, headers={"content-type": "application/json"})
            else:
                response = client.post(path, json=body)
            answers.append({"name": name, "status": response.status_code, "detail": response.text[:160]})
    return answers


def serves_normally(url: str, model: str) -> bool:
    """Whether a plain chat request after the battery gets tokens back and /health says ready."""
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "seed": 1}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    health = httpx.get(f"{url}/health", timeout=30)
    return answer.status_code == 200 and bool(answer.json()["choices"][0]["token_ids"]) and health.status_code == 200


if __name__ == "__main__":
    url, model = sys.argv[1], sys.argv[2]
    answers = run_battery(url, model)
    for answer in answers:
        print(f"{answer['status']}  {answer['name']}: {answer['detail'][:100]}")
    summary = {
        "requests": len(answers),
        "by_status": {str(s): sum(a["status"] == s for a in answers) for s in sorted({a["status"] for a in answers})},
        "server_errors": [a["name"] for a in answers if a["status"] >= 500],
        "serves_normally_after": serves_normally(url, model),
    }
    print(json.dumps(summary))
