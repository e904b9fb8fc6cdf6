"""``cuda-agent serve``: the environment service for remote RL rollouts (docs/service.md).

    CUDA_AGENT_API_KEYS=$KEY cuda-agent serve --device cpu --workers 2
    cuda-agent serve --print-openapi > docs/service-openapi.json
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cuda_agent.cli import overrides
from cuda_agent.cli.exits import bad_input
from cuda_agent.cli.usage import one_of


def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on."),
    port: int = typer.Option(8321, help="TCP port."),
    keys: list[str] = typer.Option(
        [], "--key", help="Accepted API key (repeat for more; $CUDA_AGENT_API_KEYS adds more)."),
    root: Path | None = typer.Option(None, help="Folder for the episode workspaces."),
    workers: int = typer.Option(1, help="Judge workers on the CPU (on CUDA: one per GPU)."),
    device: str = typer.Option("auto", help="auto, cpu or cuda: where episodes run.",
                                callback=one_of("auto", "cpu", "cuda")),
    max_episodes: int = typer.Option(64, help="Episodes open at once."),
    allow_no_auth: bool = typer.Option(False, help="Serve without a key (private network only)."),
    sets: list[str] = typer.Option([], "--set", help="Config override KEY=VALUE, e.g. "
                                   "pool.judge.trials=3 or sandbox.timeout_s=30."),
    print_openapi: bool = typer.Option(False, help="Print the OpenAPI spec and exit."),
) -> None:
    """Serve agent episodes over HTTP: workspace, shell, files, build, verify, judge."""
    from cuda_agent.service import ServiceConfig, ServiceConfigError, create_app, openapi_spec

    if print_openapi:
        print(json.dumps(openapi_spec(), indent=1))
        return
    config = ServiceConfig(host=host, port=port, api_keys=keys, root=root, device=device,
                           max_episodes=max_episodes, allow_no_auth=allow_no_auth)
    config = config.model_copy(update={"pool": config.pool.model_copy(
        update={"cpu_workers": workers})})
    config = overrides.apply(config, sets)
    try:
        app = create_app(config)
    except ServiceConfigError as exc:
        raise bad_input(exc) from None
    import uvicorn

    uvicorn.run(app, host=config.host, port=config.port, log_level="info",
                timeout_graceful_shutdown=30)
