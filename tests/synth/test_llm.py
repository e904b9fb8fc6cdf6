"""The LLM composer against a real OpenAI-compatible HTTP server on loopback."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cuda_agent.synth.catalog import load_catalog
from cuda_agent.synth.config import ComposerConfig, LLMConfig
from cuda_agent.synth.filters import Checker
from cuda_agent.synth.llm import LLMComposer, extract_code
from tests.synth.conftest import GOOD


class _Chat(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Chat.requests.append({"path": self.path, "body": body,
                               "auth": self.headers.get("Authorization")})
        reply = {"id": "chatcmpl-1", "object": "chat.completion", "created": 0,
                 "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant",
                                          "content": f"Here it is:\n```python\n{GOOD}```\n"}}],
                 "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def server():
    httpd = HTTPServer(("127.0.0.1", 0), _Chat)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()


def test_llm_composer_round_trip(server, pool, fast_filters, monkeypatch):
    monkeypatch.setenv("SYNTH_TEST_KEY", "secret")
    composer = LLMComposer(load_catalog(), ComposerConfig(),
                           LLMConfig(base_url=server, model="stub-model",
                                     api_key_env="SYNTH_TEST_KEY"))
    cand = composer.compose(7)
    assert cand is not None and cand.composer == "llm"
    assert cand.code.strip() == GOOD.strip() and cand.ops
    sent = _Chat.requests[-1]
    assert sent["path"] == "/v1/chat/completions" and sent["auth"] == "Bearer secret"
    assert sent["body"]["model"] == "stub-model"
    prompt = sent["body"]["messages"][0]["content"]
    assert all(op in prompt for op in cand.ops)
    assert Checker(fast_filters, "cpu", pool).check(cand.code, cand.ops).accepted


def test_extract_code():
    assert extract_code("```py\na = 1\n```") == "a = 1\n"
    assert extract_code("a = 2") == "a = 2\n"
