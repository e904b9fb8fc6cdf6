"""Python client of the environment service (httpx); thread-safe, one connection pool.

    with ServiceClient("http://127.0.0.1:8321", api_key) as client:
        with client.open_episode("builtin:gelu_bias_scale", "cpu") as episode:
            episode.write_file("kernels/k.cpp", source)
            print(episode.build()["ok"], episode.judge()["reward"], episode.diff()["diff"])

Every 4xx/5xx answer raises ``ServiceError(status, reason)``; methods return the JSON body.
"""

from __future__ import annotations

from typing import Any

import httpx


class ServiceError(RuntimeError):
    """The service refused or failed a call: ``status`` is the HTTP status."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


class ServiceClient:
    """A connection to one service with one API key."""

    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = 960.0,
                 max_connections: int = 128):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_s,
            limits=httpx.Limits(max_connections=max_connections,
                                max_keepalive_connections=max_connections))

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                params: dict[str, str] | None = None) -> Any:
        """One call; the decoded JSON (or text) body, or ``ServiceError``."""
        try:
            response = self._http.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise ServiceError(0, f"no answer from the service: {exc!r}") from None
        if response.status_code >= 400:
            raise ServiceError(response.status_code, _reason(response))
        if response.headers.get("content-type", "").startswith("application/json"):
            return response.json()
        return response.text

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/health")

    def metrics(self, prometheus: bool = False) -> Any:
        return self.request("GET", "/metrics",
                            params={"format": "prometheus" if prometheus else "json"})

    def open_episode(self, task: str, device: str | None = None) -> Episode:
        """Open an episode for ``task`` (builtin:NAME or a path under a task root)."""
        body: dict[str, Any] = {"task": task}
        if device is not None:
            body["device"] = device
        info = self.request("POST", "/v1/episodes", body)
        return Episode(self, info["handle"], info)


class Episode:
    """One open episode; a context manager that closes it on the way out."""

    def __init__(self, client: ServiceClient, handle: str, info: dict[str, Any]):
        self.client = client
        self.handle = handle
        self.info = info
        self.closed = False

    def __enter__(self) -> Episode:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            try:
                self.close()
            except ServiceError as error:
                if error.status != 404:
                    raise

    def __repr__(self) -> str:
        return f"Episode(task={self.info.get('task')!r}, closed={self.closed})"

    def _call(self, method: str, tool: str = "", body: dict[str, Any] | None = None) -> Any:
        path = f"/v1/episodes/{self.handle}" + (f"/{tool}" if tool else "")
        return self.client.request(method, path, body)

    def status(self) -> dict[str, Any]:
        return self._call("GET")

    def shell(self, command: str, timeout_s: float | None = None) -> dict[str, Any]:
        """exit_code, stdout, stderr, timed_out, killed_reason, truncated, isolation."""
        body: dict[str, Any] = {"command": command}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        return self._call("POST", "shell", body)

    def read_file(self, path: str) -> str:
        return self._call("POST", "read_file", {"path": path})["content"]

    def write_file(self, path: str, content: str) -> int:
        """Returns the bytes written."""
        return self._call("POST", "write_file", {"path": path, "content": content})["size"]

    def list_files(self, path: str = ".") -> list[dict[str, Any]]:
        return self._call("POST", "list_files", {"path": path})["entries"]

    def build(self) -> dict[str, Any]:
        return self._call("POST", "build")

    def verify(self) -> dict[str, Any]:
        return self._call("POST", "verify")

    def profile(self) -> dict[str, Any]:
        return self._call("POST", "profile")

    def judge(self) -> dict[str, Any]:
        """judgement_id, reward, failure, seconds, result (the JudgeResult)."""
        return self._call("POST", "judge")

    def reward(self) -> dict[str, Any]:
        return self._call("GET", "reward")

    def judgements(self) -> list[dict[str, Any]]:
        return self._call("GET", "judgements")["judgements"]

    def diff(self) -> dict[str, Any]:
        return self._call("GET", "diff")

    def close(self) -> dict[str, Any]:
        """Close the episode and delete its workspace."""
        answer = self._call("DELETE")
        self.closed = True
        return answer


def _reason(response: httpx.Response) -> str:
    try:
        data = response.json()
    except ValueError:
        return response.text[:500] or response.reason_phrase
    if isinstance(data, dict) and "error" in data:
        return str(data["error"])
    return str(data)[:500]
