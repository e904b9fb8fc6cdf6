"""The environment service: RL trainers open episodes and call an agent's tools over HTTP.

    app = create_app(ServiceConfig(api_keys=["..."]))      # then: uvicorn.run(app)
    cuda-agent serve --key "$KEY" --device cpu               # the same from the shell

Routes: ``/health`` (no key), ``/metrics`` and ``/v1/episodes[/{handle}/TOOL]`` (key).
Every error is JSON ``{"error": reason}``. See docs/service.md.
"""

from __future__ import annotations

import logging
from typing import Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException

from cuda_agent import __version__
from cuda_agent.service.config import ServiceConfig
from cuda_agent.service.errors import ApiError
from cuda_agent.service.guards import AuthGate, BodyLimit, KeyRing, key_checker
from cuda_agent.service.metrics import prometheus
from cuda_agent.service.routes import episode_routes
from cuda_agent.service.runtime import Service
from cuda_agent.service.schemas import ErrorOut, HealthOut

log = logging.getLogger("cuda_agent.service")

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": text} for code, text in (
        (400, "Refused input (path, task, device), with the reason"),
        (401, "Missing or wrong API key"),
        (404, "No such episode, or no such file"),
        (409, "The episode is busy with another call"),
        (413, "Request body too large"),
        (422, "Malformed request body"),
        (429, "Too many episodes open"),
        (503, "No verdict could be made, or the service is stopping"),
        (504, "The tool outlasted the request's time limit"))}


def create_app(config: ServiceConfig | None = None) -> FastAPI:
    """The FastAPI app of the service; starts nothing until the server starts it."""
    config = config or ServiceConfig()
    config.check()
    service = Service(config)
    app = FastAPI(title="cuda-agent environment service", version=__version__,
                  description="Agent episodes for RL rollouts: a workspace per episode, "
                  "sandboxed shell, file tools, build, verify, profile and the judge's reward.",
                  lifespan=service.lifespan)
    app.state.service = service
    ring = KeyRing(config.keys())
    app.add_middleware(BodyLimit, limit=config.max_request_bytes)
    app.add_middleware(AuthGate, ring=ring, prefixes=("/v1", "/metrics"))
    _install_handlers(app)
    auth = key_checker(ring)

    @app.get("/health", response_model=HealthOut, tags=["service"])
    def health() -> HealthOut:
        """Liveness; needs no key."""
        return HealthOut(status="ok", version=__version__, device=service.device)

    @app.get("/metrics", dependencies=[Depends(auth)], responses=ERRORS, tags=["service"])
    def metrics(format: Literal["json", "prometheus"] = "json") -> Any:  # noqa: A002
        """Episodes open and total, tool calls and latency percentiles by tool, judge jobs.
        ``?format=prometheus`` gives the Prometheus text format."""
        snapshot = service.snapshot()
        if format == "prometheus":
            return PlainTextResponse(prometheus(snapshot), media_type="text/plain; version=0.0.4")
        return snapshot

    router = APIRouter(prefix="/v1", responses=ERRORS)
    episode_routes(router, service, auth)
    app.include_router(router)
    return app


def _install_handlers(app: FastAPI) -> None:
    """Every error leaves as JSON with a reason; an unexpected one is logged as a bug."""

    @app.exception_handler(ApiError)
    async def api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse({"error": exc.reason}, exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [{"loc": [str(p) for p in e.get("loc", ())], "msg": str(e.get("msg", "")),
                    "type": str(e.get("type", ""))} for e in exc.errors()]
        summary = "; ".join(f"{'.'.join(d['loc'])}: {d['msg']}" for d in details[:5])
        return JSONResponse({"error": f"invalid request: {summary}", "detail": details}, 422)

    @app.exception_handler(HTTPException)
    async def http_error(_request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def internal(_request: Request, exc: Exception) -> JSONResponse:
        log.error("internal error", exc_info=exc)
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); the service "
                             "log has the details"}, 500)


def openapi_spec() -> dict[str, Any]:
    """The service's OpenAPI document (no key or server needed)."""
    return create_app(ServiceConfig(allow_no_auth=True, device="cpu")).openapi()
