"""The one error type tools raise: an HTTP status and a reason the client can act on."""

from __future__ import annotations


class ApiError(Exception):
    """A request the service refuses or cannot serve; becomes ``{"error": reason}``."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None):
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers or {}


def bad_request(reason: str) -> ApiError:
    return ApiError(400, reason)


NOT_FOUND = "no such episode (closed, expired, or never opened)"


def not_found() -> ApiError:
    """The same answer whether the handle never existed or belongs to someone else."""
    return ApiError(404, NOT_FOUND)
