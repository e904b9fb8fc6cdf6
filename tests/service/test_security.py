"""Adversarial requests against the real service: keys, other clients' episodes, paths
that leave the workspace, malformed and oversized bodies, and the episode limit. Every bad
input gets a 4xx with a JSON reason, never a 500."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cuda_agent.service import ServiceClient, ServiceError
from tests.service.conftest import KEY, MAX_BODY, MAX_EPISODES, OTHER_KEY, TASK, Running

AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def http(service: Running) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, timeout=120) as c:
        yield c


@pytest.fixture
def episode(client: ServiceClient):
    with client.open_episode(TASK) as opened:
        yield opened


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    reason = response.json()["error"]
    assert isinstance(reason, str) and reason
    return reason


def test_keys_are_required_and_checked(http: httpx.Client, episode):
    assert http.get("/health").json()["status"] == "ok"
    tool = f"/v1/episodes/{episode.handle}/read_file"
    for headers in ({}, {"Authorization": "Bearer wrong-key-123"}, {"X-API-Key": "nope"},
                    {"Authorization": f"Basic {KEY}"}, {"Authorization": "Bearer"}):
        assert _error(http.get("/metrics", headers=headers), 401)
        assert _error(http.post("/v1/episodes", json={"task": TASK}, headers=headers), 401)
        assert _error(http.post(tool, json={"path": "model.py"}, headers=headers), 401)
        assert http.get("/metrics", headers=headers).headers["www-authenticate"] == "Bearer"
        garbled = http.post(tool, content=b"{", headers={**headers, "Content-Type":
                                                          "application/json"})
        assert _error(garbled, 401), "a stranger must not reach body parsing"
    assert http.post(tool, json={"path": "model.py"}, headers={"X-API-Key": KEY}).is_success
    assert http.post(tool, json={"path": "model.py"}, headers=AUTH).is_success


def test_other_clients_and_wrong_handles_see_nothing(service: Running, episode):
    with ServiceClient(service.url, OTHER_KEY) as other:
        stolen = other.open_episode(TASK)  # a second client's own episode works
        try:
            stolen.handle, real = episode.handle, stolen.handle
            answers = []
            for call in (lambda: stolen.read_file("model.py"), stolen.status, stolen.diff,
                         stolen.reward, stolen.judge, lambda: stolen.shell("true")):
                with pytest.raises(ServiceError) as refused:
                    call()
                answers.append((refused.value.status, refused.value.reason))
            with pytest.raises(ServiceError) as missing:
                other.request("GET", "/v1/episodes/" + "x" * 43 + "/reward")
            assert set(answers) == {(missing.value.status, missing.value.reason)}
            assert missing.value.status == 404
            stolen.handle = real
        finally:
            stolen.close()
    assert episode.read_file("model.py")  # still there for its owner


def test_paths_cannot_leave_the_workspace(service: Running, episode, client: ServiceClient):
    with client.open_episode(TASK) as neighbour:
        neighbour.write_file("secret.txt", "neighbour's")
        folder = next(p for p in service.root.iterdir()
                      if (p / "workspace" / "secret.txt").exists())
        secret = folder / "workspace" / "secret.txt"
        episode.shell(f"ln -s {secret} leak && ln -s / rootlink && ln -s .. up")
        for path in ("../secret.txt", "/etc/passwd", str(secret), "kernels/../../x",
                     f"../{folder.name}/workspace/secret.txt", "leak", "rootlink/etc/passwd",
                     "up/x", "a\x00b", "..", "kernels/../../../etc/passwd"):
            for tool, body in (("read_file", {"path": path}),
                               ("write_file", {"path": path, "content": "x"}),
                               ("list_files", {"path": path})):
                with pytest.raises(ServiceError) as refused:
                    episode._call("POST", tool, body)
                assert refused.value.status == 400, (tool, path, refused.value)
        assert secret.read_text() == "neighbour's"
        for fixed in ("model.py", "binding.cpp", "utils/build", ".cuda-agent/workspace.json"):
            with pytest.raises(ServiceError) as refused:
                episode.write_file(fixed, "tampered")
            assert refused.value.status == 400 and "read-only" in refused.value.reason
        kinds = {e["path"]: e["kind"] for e in episode.list_files()}
        assert kinds["leak"] == "link" and ".cuda-agent" not in kinds


@pytest.mark.parametrize("body", [
    b"{", b"[]", b"null", b"not json", b'{"task": 5}', b"{}", b'{"task": "builtin:nope"}',
    b'{"task": "' + TASK.encode() + b'", "device": "tpu"}', b'{"task": "", "x": 1}',
    b'{"task": "/etc/passwd"}', b'{"task": "../../x.py"}', b'{"task": "a.py"}',
    b"\xff\xfe\x00garbage", b'{"task": "' + b"[" * 5000 + b'"}', b"[" * 100_000,
    b'{"task": "builtin:gelu_bias_scale\\u0000"}', b'{"task": "builtin:gelu_bias_scale", '
    b'"device": "cuda"}'])
def test_malformed_open_requests_get_4xx(http: httpx.Client, body: bytes):
    response = http.post("/v1/episodes", content=body,
                         headers={**AUTH, "Content-Type": "application/json"})
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    assert response.json()["error"]


def test_malformed_tool_requests_get_4xx(http: httpx.Client, episode):
    base = f"/v1/episodes/{episode.handle}"
    cases = [
        ("POST", "/shell", b'{"command": ""}'), ("POST", "/shell", b'{"command": 7}'),
        ("POST", "/shell", b'{"command": "true", "timeout_s": -1}'),
        ("POST", "/shell", b'{"command": "true", "timeout_s": NaN}'),
        ("POST", "/shell", b'{"command": "a\\u0000b"}'),
        ("POST", "/shell", b'{"command": "true", "extra": 1}'),
        ("POST", "/write_file", b'{"path": "x"}'), ("POST", "/read_file", b'{"path": ""}'),
        ("POST", "/read_file", b'{"path": "nope.txt"}'), ("POST", "/read_file", b'{"path": "."}'),
        ("POST", "/read_file", b'{"path": "' + b"a/" * 600 + b'"}'),
        ("POST", "/write_file", b'{"path": "kernels", "content": "x"}'),
        ("POST", "/list_files", b'{"path": "model.py"}'), ("GET", "/shell", b""),
        ("POST", "/nosuchtool", b"{}"), ("PUT", "", b"{}"), ("POST", "/reward", b"{}"),
    ]
    for method, suffix, body in cases:
        response = http.request(method, base + suffix, content=body,
                                headers={**AUTH, "Content-Type": "application/json"})
        assert 400 <= response.status_code < 500, (suffix, body[:40], response.text)
        assert response.json()["error"], (suffix, response.text)
    assert _error(http.get("/nowhere", headers=AUTH), 404)
    episode.write_file("bin.dat", "x")
    episode.shell("printf '\\377\\376' > bin.dat")
    assert "UTF-8" in _error(http.post(base + "/read_file", json={"path": "bin.dat"},
                                       headers=AUTH), 400)


def test_oversized_bodies_get_413(http: httpx.Client, episode):
    url = f"/v1/episodes/{episode.handle}/write_file"
    big = {"path": "big.txt", "content": "x" * (MAX_BODY + 1)}
    assert "bytes" in _error(http.post(url, json=big, headers=AUTH), 413)

    def chunks():
        for _ in range(MAX_BODY // 4096 + 2):
            yield b"x" * 4096

    assert _error(http.post(url, content=chunks(), headers=AUTH), 413)
    fits = {"path": "fits.txt", "content": "y" * (MAX_BODY // 2)}
    assert http.post(url, json=fits, headers=AUTH).json()["size"] == MAX_BODY // 2


def test_too_many_episodes_get_429(client: ServiceClient):
    opened = []
    try:
        while len(opened) < MAX_EPISODES + 1:
            try:
                opened.append(client.open_episode(TASK))
            except ServiceError as full:
                assert full.status == 429 and str(MAX_EPISODES) in full.reason
                break
        else:
            pytest.fail("no 429 after max_episodes + 1 opens")
        assert client.metrics()["episodes"]["open"] == MAX_EPISODES
    finally:
        for episode in opened:
            episode.close()
    with client.open_episode(TASK):
        pass  # room again
