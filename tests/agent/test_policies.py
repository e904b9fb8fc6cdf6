"""The policies: OpenAI-protocol against a real loopback server, a tiny local HF model,
replay of recordings, and ``make_policy``.

    pytest -q tests/agent/test_policies.py
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from cuda_agent.agent.policies import make_policy
from cuda_agent.agent.policies.calls import parse_tool_calls
from cuda_agent.agent.policies.replay import END_CALL_ID, ReplayPolicy
from cuda_agent.agent.types import (
    Message,
    PolicyError,
    ToolCall,
    ToolSpec,
    message_to_dict,
)

RUN = ToolSpec("run", "Run a shell command.", {"type": "object",
                                               "properties": {"command": {"type": "string"}}})
SUBMIT = ToolSpec("submit", "Finish.", {"type": "object", "properties": {}})


# --- a scripted chat-completions server on loopback ------------------------------------


def completion(content: str | None = None, tool_calls: list[dict] | None = None,
               refusal: str | None = None) -> dict[str, Any]:
    message = {"role": "assistant", "content": content, "refusal": refusal}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "tiny",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}


def wire_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": arguments}}


class ScriptedServer:
    """Answers POST /v1/chat/completions with scripted (status, body) pairs, in order;
    the body "hang" makes it wait until the test ends."""

    def __init__(self, script: list[tuple[int, Any]]) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                server.requests.append(json.loads(self.rfile.read(length)))
                status, body = server.script.pop(0) if server.script else (500, "no script")
                if body == "hang":
                    server.release.wait(10)
                    return
                data = json.dumps(body if isinstance(body, dict)
                                  else {"error": {"message": body}}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers: list[ScriptedServer] = []

    def start(*script: tuple[int, Any]) -> ScriptedServer:
        servers.append(ScriptedServer(list(script)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def openai_policy(server: ScriptedServer, **options: Any):
    options = {"timeout_s": 5, "max_retries": 2, "backoff_s": 0.01, **options}
    return make_policy("openai:tiny", base_url=server.base_url, api_key="k", **options)


def test_openai_request_shape_and_tool_calls(serve) -> None:
    server = serve((200, completion("reading", [wire_call("c1", "run", '{"command": "ls"}')])))
    policy = openai_policy(server, temperature=0.5, max_tokens=64)
    history = [Message("system", "be brief"), Message("user", "go"),
               Message("assistant", "", (ToolCall("c0", "run", {"command": "pwd"}),)),
               Message("tool", "/work", tool_call_id="c0")]
    step = policy.step(history, [RUN, SUBMIT])
    assert step.message == Message("assistant", "reading",
                                   (ToolCall("c1", "run", {"command": "ls"}),))
    assert (step.usage.prompt_tokens, step.usage.completion_tokens) == (11, 7)
    assert step.tokens is None
    sent = server.requests[0]
    assert sent["model"] == "tiny" and sent["temperature"] == 0.5 and sent["max_tokens"] == 64
    assert [t["function"]["name"] for t in sent["tools"]] == ["run", "submit"]
    assert sent["tools"][0]["type"] == "function"
    assert sent["tools"][0]["function"]["parameters"] == RUN.parameters
    call = sent["messages"][2]["tool_calls"][0]
    assert call["id"] == "c0" and call["type"] == "function"
    assert isinstance(call["function"]["arguments"], str)
    assert json.loads(call["function"]["arguments"]) == {"command": "pwd"}
    assert sent["messages"][3] == {"role": "tool", "tool_call_id": "c0", "content": "/work"}


def test_openai_malformed_arguments_refusal_and_empty(serve) -> None:
    server = serve((200, completion(None, [wire_call("c1", "run", '{"command": "ls"'),
                                           wire_call("c2", "run", "[1, 2]")])),
                   (200, completion(None, refusal="I can't help with that.")),
                   (200, completion(None)))
    policy = openai_policy(server)
    bad = policy.step([Message("user", "go")], [RUN]).message
    assert [c.arguments for c in bad.tool_calls] == [None, None]
    assert [c.raw_arguments for c in bad.tool_calls] == ['{"command": "ls"', "[1, 2]"]
    refusal = policy.step([Message("user", "go")], [RUN]).message
    assert refusal == Message("assistant", "I can't help with that.")
    assert policy.step([Message("user", "go")], []).message == Message("assistant", "")
    assert "tools" not in server.requests[2]


def test_openai_retries_server_errors(serve) -> None:
    server = serve((500, "boom"), (500, "boom"), (200, completion("ok")))
    step = openai_policy(server).step([Message("user", "go")], [])
    assert step.message.content == "ok" and len(server.requests) == 3


def test_openai_gives_up_and_refuses_clearly(serve) -> None:
    server = serve((503, "busy"), (503, "busy"), (503, "busy"))
    with pytest.raises(PolicyError, match="after 3 attempt.*HTTP 503"):
        openai_policy(server).step([Message("user", "go")], [])
    server = serve((400, "bad request"))
    with pytest.raises(PolicyError, match="HTTP 400"):
        openai_policy(server).step([Message("user", "go")], [])
    assert len(server.requests) == 1


def test_openai_hanging_server_times_out(serve) -> None:
    server = serve((200, "hang"), (200, "hang"))
    start = time.monotonic()
    with pytest.raises(PolicyError, match="timeout_s=0.5"):
        openai_policy(server, timeout_s=0.5, max_retries=1).step([Message("user", "go")], [])
    assert time.monotonic() - start < 4


def test_openai_connection_refused() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    policy = make_policy("openai:tiny", base_url=f"http://127.0.0.1:{port}/v1",
                         max_retries=1, backoff_s=0.01, timeout_s=2)
    with pytest.raises(PolicyError, match="cannot reach"):
        policy.step([Message("user", "go")], [])


# --- replay -----------------------------------------------------------------------------


def test_replay_trajectory_then_submit(tmp_path: Path) -> None:
    first = Message("assistant", "look", (ToolCall("a1", "run", {"command": "ls"}),))
    second = Message("assistant", "", (ToolCall("a2", "run", None, "{oops"),))
    records = [{"type": "episode_start", "task": "t"},
               {"type": "message", "message": message_to_dict(Message("system", "s"))},
               {"type": "message", "message": message_to_dict(first)},
               {"type": "tool_result", "ok": True},
               {"type": "message", "message": message_to_dict(Message("tool", "x",
                                                                      tool_call_id="a1"))},
               {"type": "message", "message": message_to_dict(second)},
               {"type": "episode_end"}]
    path = tmp_path / "trajectory.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    policy = make_policy(f"replay:{path}")
    assert policy.step([], []).message == first
    assert policy.step([], []).message == second
    for _ in range(2):
        end = policy.step([], []).message
        assert [(c.id, c.name) for c in end.tool_calls] == [(END_CALL_ID, "submit")]


def test_replay_json_list(tmp_path: Path) -> None:
    path = tmp_path / "answers.json"
    path.write_text(json.dumps([{"content": "one"}, {"role": "user", "content": "skip"},
                                {"role": "assistant", "content": "two"}], indent=2))
    policy = ReplayPolicy(path)
    assert [policy.step([], []).message.content for _ in range(2)] == ["one", "two"]
    assert policy.exhausted


@pytest.mark.parametrize(("text", "match"), [
    (None, "not found"),
    ("[1, 2", "not valid JSON"),
    ("{not json}\n", "line 1 is not JSON"),
    ('{"type": "message", "message": {"role": "user", "content": "hi"}}\n', "no assistant"),
    ("[]", "no assistant"),
    ('[{"role": "robot"}]', "item 0"),
])
def test_replay_bad_files(tmp_path: Path, text: str | None, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    if text is not None:
        path.write_text(text)
    with pytest.raises(PolicyError, match=match):
        ReplayPolicy(path)


# --- make_policy ------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "match"), [
    ("gpt-4o", "unknown policy.*openai:MODEL"),
    ("vllm:foo", "unknown policy.*hf:PATH"),
    ("openai:", "names no model"),
    ("hf:  ", "names no model"),
])
def test_make_policy_bad_specs(spec: str, match: str) -> None:
    with pytest.raises(PolicyError, match=match):
        make_policy(spec)


def test_make_policy_options(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("CUDA_AGENT_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    policy = make_policy("openai:org/model:v1", base_url="http://127.0.0.1:9/v1",
                         temperature=None)
    assert policy.name == "openai:org/model:v1"
    assert policy.config.model == "org/model:v1" and policy.config.temperature is None
    assert policy._client.api_key == "from-env"
    with pytest.raises(PolicyError, match="bad options.*no_such_option"):
        make_policy("openai:m", no_such_option=1)
    with pytest.raises(PolicyError, match="bad options.*timeout_s"):
        make_policy("openai:m", timeout_s=-1)
    with pytest.raises(PolicyError, match="model folder not found"):
        make_policy(f"hf:{tmp_path / 'missing'}")


# --- tool-call parsing (the HF text format) --------------------------------------------


def test_parse_tool_calls() -> None:
    text = ('Let me build.\n<tool_call>\n{"name": "run", "arguments": {"command": "make"}}\n'
            '</tool_call>\n<tool_call>{"name": "submit", "arguments": "{}"}</tool_call>')
    content, calls = parse_tool_calls(text, id_prefix="s0")
    assert content == "Let me build."
    assert calls == (ToolCall("s0-0", "run", {"command": "make"}), ToolCall("s0-1", "submit", {}))
    _, calls = parse_tool_calls('<tool_call>{"name": "run", "arguments": {"command": </tool_call>'
                                '<tool_call>not json</tool_call><tool_call>{"name": "run"')
    assert [(c.name, c.arguments) for c in calls] == [("run", None), ("", None), ("run", None)]
    assert calls[1].raw_arguments == "not json"
    assert parse_tool_calls("no calls here") == ("no calls here", ())


# --- a tiny local Hugging Face model ----------------------------------------------------

CHAT_TEMPLATE = (
    "{% if tools %}TOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %};{% endif %}"
    "{% for m in messages %}[{{ m.role }}] {{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>"
    "{% endfor %}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant] {% endif %}")


def build_tiny_model(folder: Path, chat_template: str | None = None) -> Path:
    """A 2-layer GPT-2 with hidden size 32 and a byte-level BPE tokenizer trained here."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    raw.train_from_iterator(['<tool_call>{"name": "run", "arguments": {"command": "make"}}'
                             "</tool_call> system user assistant tool"] * 20, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>",
                                        clean_up_tokenization_spaces=False)
    if chat_template:
        tokenizer.chat_template = chat_template
    eos = tokenizer.eos_token_id
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=1024, n_embd=32, n_layer=2,
                        n_head=2, bos_token_id=eos, eos_token_id=eos)
    import torch

    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-plain"))


def forward_logprobs(policy, prompt_ids, response_ids) -> list[float]:
    import torch

    ids = torch.tensor([list(prompt_ids) + list(response_ids)])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(prompt_ids) - 1: -1]  # [T, V]
    chosen = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, len(prompt_ids):, None])
    return chosen[:, 0].tolist()


HISTORY = [Message("system", "Write fast kernels."), Message("user", "Make it faster."),
           Message("assistant", "ok", (ToolCall("c0", "run", {"command": "make"}),)),
           Message("tool", "built", tool_call_id="c0")]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hf_token_view(tiny_model: Path, temperature: float) -> None:
    policy = make_policy(f"hf:{tiny_model}", device="cpu", max_new_tokens=12,
                         temperature=temperature)
    step = policy.step(HISTORY, [RUN, SUBMIT])
    view = step.tokens
    assert view is not None and 0 < len(view.response_ids) <= 12
    assert len(view.response_ids) == len(view.logprobs) == len(view.loss_mask)
    assert set(view.loss_mask) == {1}
    assert all(lp <= 0 for lp in view.logprobs)
    assert forward_logprobs(policy, view.prompt_ids, view.response_ids) == pytest.approx(
        list(view.logprobs), abs=1e-4)
    rendered = policy.render(HISTORY, [RUN, SUBMIT])
    assert policy.tokenizer.decode(list(view.prompt_ids)) == rendered
    assert rendered.startswith("<|system|>\nWrite fast kernels.\n\n# Tools")
    assert '<tool_call>{"name": "run", "arguments": {"command": "make"}}</tool_call>' in rendered
    assert rendered.endswith("<|tool|>\nbuilt\n<|endoftext|>\n<|assistant|>\n")
    assert (step.usage.prompt_tokens, step.usage.completion_tokens) == (
        len(view.prompt_ids), len(view.response_ids))
    assert step.message.role == "assistant"


def test_hf_chat_template_and_forced_tool_call(tmp_path: Path) -> None:
    folder = build_tiny_model(tmp_path / "tiny-chat", CHAT_TEMPLATE)
    policy = make_policy(f"hf:{folder}", device="cpu", max_new_tokens=4, temperature=0)
    rendered = policy.render(HISTORY, [RUN, SUBMIT])
    assert rendered.startswith("TOOLS: run submit;[system] Write fast kernels.<|endoftext|>")
    assert ('[assistant] ok<tool_call>{"name": "run", "arguments": {"command": "make"}}'
            "</tool_call><|endoftext|>") in rendered
    assert rendered.endswith("[tool] built<|endoftext|>\n[assistant] ")
    view = policy.step(HISTORY, [RUN]).tokens
    assert policy.tokenizer.decode(list(view.prompt_ids)) == policy.render(HISTORY, [RUN])

    forced = 'Building.<tool_call>{"name": "run", "arguments": {"command": "make"}}</tool_call>'
    forced_ids = policy.tokenizer(forced, add_special_tokens=False)["input_ids"]
    policy._generate = lambda prompt_ids: (forced_ids, [-1.0] * len(forced_ids))
    step = policy.step(HISTORY, [RUN])
    assert step.message.content == "Building."
    assert [(c.name, c.arguments) for c in step.message.tool_calls] == [
        ("run", {"command": "make"})]
    assert step.tokens.response_ids == tuple(forced_ids)
