"""One real service for all tests here: uvicorn on a loopback port in a thread, CPU device,
a fast judge (2 trials, no scales, no timing), and the session's shared build cache."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

from cuda_agent.execution import PoolConfig, SandboxConfig
from cuda_agent.judge import JudgeConfig
from cuda_agent.service import ServiceClient, ServiceConfig, create_app
from cuda_agent.tasks.loaders import builtin_dir

KEY = "test-key-0123456789"
OTHER_KEY = "test-key-abcdefghij"
TASK = "builtin:gelu_bias_scale"
MAX_EPISODES = 12
MAX_BODY = 256 * 1024
FAST = JudgeConfig(device="cpu", time=False, trials=2, scales=())
SOLUTION = builtin_dir() / "gelu_bias_scale" / "solution" / "cpu"


@dataclass(frozen=True)
class Running:
    url: str
    app: FastAPI
    root: Path


def solution_files(wrong: bool = False) -> dict[str, str]:
    """The shipped CPU solution; ``wrong`` doubles the scale (a wrong answer, same code)."""
    found = {p.relative_to(SOLUTION).as_posix(): p.read_text()
             for p in SOLUTION.rglob("*") if p.is_file()}
    if wrong:
        found["model_new.py"] = found["model_new.py"].replace("self.bias, self.scale)",
                                                              "self.bias, 2 * self.scale)")
        assert "2 * self.scale" in found["model_new.py"]
    return found


@pytest.fixture(scope="session")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    root = tmp_path_factory.mktemp("episodes")
    config = ServiceConfig(
        api_keys=[KEY, OTHER_KEY], root=root, device="cpu", max_episodes=MAX_EPISODES,
        max_request_bytes=MAX_BODY, busy_timeout_s=30, tool_timeout_s=300,
        sandbox=SandboxConfig(timeout_s=20, output_limit_bytes=4096), judge=FAST,
        pool=PoolConfig(gpus=[], cpu_workers=1, judge=FAST, job_timeout_s=240))
    app = create_app(config)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    yield Running(f"http://127.0.0.1:{port}", app, root)
    server.should_exit = True
    thread.join(60)
    sock.close()


@pytest.fixture
def client(service: Running) -> Iterator[ServiceClient]:
    with ServiceClient(service.url, KEY, timeout_s=300) as c:
        yield c
