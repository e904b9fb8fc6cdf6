"""Authentication and the request-size limit.

Clients send ``Authorization: Bearer KEY`` or ``X-API-Key: KEY``. Keys are compared as
SHA-256 digests with ``hmac.compare_digest`` against every configured key, so neither the
key's length nor which key matched shows in the time taken.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable

from fastapi import Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cuda_agent.service.errors import ApiError

bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer KEY")
api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False, description="X-API-Key: KEY")


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).digest()


class KeyRing:
    """The accepted keys; ``owner`` names who a key belongs to (an id derived from it).

    With no keys every request passes as the same anonymous owner: the service was told to
    allow that (``allow_no_auth``).
    """

    def __init__(self, keys: list[str]):
        self._digests = [_digest(k) for k in keys]

    def owner(self, given: str | None) -> str:
        """The owner id of ``given``; ``ApiError(401)`` when it is missing or wrong."""
        if not self._digests:
            return "anonymous"
        if not given:
            raise ApiError(401, "missing API key (send 'Authorization: Bearer KEY' or "
                           "'X-API-Key: KEY')", CHALLENGE)
        found = _digest(given)
        owner = ""
        for digest in self._digests:
            if hmac.compare_digest(found, digest):
                owner = digest.hex()[:16]
        if not owner:
            raise ApiError(401, "wrong API key", CHALLENGE)
        return owner

    def from_headers(self, headers: dict[bytes, bytes]) -> str:
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, token = auth.partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else None
        if not given:
            given = headers.get(b"x-api-key", b"").decode("latin-1") or None
        return self.owner(given)


CHALLENGE = {"WWW-Authenticate": "Bearer"}


def key_checker(ring: KeyRing) -> Callable[..., str]:
    """A FastAPI dependency that returns the caller's owner id (documents both headers)."""

    def require_key(credentials: HTTPAuthorizationCredentials | None = Security(bearer),
                    header: str | None = Security(api_key_header)) -> str:
        return ring.owner(credentials.credentials if credentials is not None else header)

    return require_key


class AuthGate:
    """ASGI middleware: requests under ``prefixes`` without a good key get 401 before their
    body is read or parsed, so a stranger learns nothing from validation errors."""

    def __init__(self, app: ASGIApp, ring: KeyRing, prefixes: tuple[str, ...]):
        self.app = app
        self.ring = ring
        self.prefixes = prefixes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(self.prefixes):
            try:
                self.ring.from_headers(dict(scope.get("headers", [])))
            except ApiError as exc:
                await _refuse(send, exc.status, exc.reason, exc.headers)
                return
        await self.app(scope, receive, send)


class BodyLimit:
    """ASGI middleware: a request body over ``limit`` bytes gets 413 before any route runs.

    A declared Content-Length over the limit is refused at once; a body without one (or
    lying about it) is read up to the limit and refused when it goes over.
    """

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _refuse(send, 400, "Content-Length is not a number")
                return
            if int(declared) > self.limit:
                await _refuse(send, 413, self._too_large())
                return
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.limit:
                await _refuse(send, 413, self._too_large())
                return
            if not message.get("more_body"):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _too_large(self) -> str:
        return f"request body over {self.limit} bytes, the most this service accepts"


async def _refuse(send: Send, status: int, reason: str,
                  headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"error": reason}).encode()
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"), *extra]})
    await send({"type": "http.response.body", "body": body})
