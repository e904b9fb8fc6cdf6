"""The service's configuration, metrics, OpenAPI document and idle expiry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuda_agent.service import ServiceClient, ServiceConfig, ServiceConfigError, openapi_spec
from cuda_agent.service.config import KEYS_ENV
from cuda_agent.service.metrics import percentile
from tests.service.conftest import TASK, Running

DOCS = Path(__file__).resolve().parents[2] / "docs" / "service-openapi.json"


def test_refuses_to_start_without_a_key(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(KEYS_ENV, raising=False)
    with pytest.raises(ServiceConfigError, match="no API key"):
        ServiceConfig().check()
    ServiceConfig(allow_no_auth=True).check()
    with pytest.raises(ServiceConfigError, match="at least 8"):
        ServiceConfig(api_keys=["short"]).check()
    monkeypatch.setenv(KEYS_ENV, " key-from-env-1, ,key-from-env-2")
    config = ServiceConfig(api_keys=["key-in-config"])
    config.check()
    assert config.keys() == ["key-in-config", "key-from-env-1", "key-from-env-2"]


def test_openapi_document_is_current():
    spec = openapi_spec()
    assert "/v1/episodes/{handle}/judge" in spec["paths"]
    assert {"HTTPBearer", "APIKeyHeader"} <= set(spec["components"]["securitySchemes"])
    assert json.loads(DOCS.read_text()) == json.loads(json.dumps(spec)), \
        "regenerate: cuda-agent serve --print-openapi > docs/service-openapi.json"


def test_metrics_in_json_and_prometheus(client: ServiceClient):
    with client.open_episode(TASK) as episode:
        episode.shell("true")
    snapshot = client.metrics()
    assert snapshot["episodes"]["opened_total"] >= 1
    assert snapshot["tools"]["shell"]["calls"] >= 1
    assert {"queued", "running", "done", "failed"} <= set(snapshot["judge_jobs"])
    text = client.metrics(prometheus=True)
    assert "# TYPE cuda_agent_tool_calls_total counter" in text
    assert 'cuda_agent_tool_latency_seconds{tool="shell",quantile="0.99"}' in text
    assert "cuda_agent_episodes_open 0" in text
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.0 and percentile([], 99) == 0.0


def test_idle_episodes_are_closed(client: ServiceClient, service: Running):
    episode = client.open_episode(TASK)
    manager = service.app.state.service.episodes
    expired = manager.expired_total
    assert manager.reap(idle_timeout_s=3600) == 0
    assert manager.reap(idle_timeout_s=0) == 1
    assert manager.expired_total == expired + 1
    with pytest.raises(Exception) as gone:
        episode.reward()
    assert getattr(gone.value, "status", None) == 404
    assert not [p for p in service.root.iterdir() if p.is_dir()]


def test_task_sources_stay_inside_the_task_roots(tmp_path: Path):
    from cuda_agent.service.errors import ApiError
    from cuda_agent.service.sources import TaskSources
    from tests.conftest import SCALE_ADD_TASK

    roots = tmp_path / "tasks"
    (roots / "set").mkdir(parents=True)
    (roots / "set" / "scale_add.py").write_text(SCALE_ADD_TASK)
    outside = tmp_path / "outside.py"
    outside.write_text(SCALE_ADD_TASK)
    (roots / "escape.py").symlink_to(outside)
    sources = TaskSources([roots], allow_builtin=False)
    assert sources.resolve("set/scale_add.py").name == "scale_add"
    for ref in (str(outside), "../outside.py", "escape.py", "set/../../outside.py",
                "missing.py", TASK, "", "set/scale_add.py::nope"):
        with pytest.raises(ApiError) as refused:
            sources.resolve(ref)
        assert refused.value.status == 400 and str(tmp_path) not in refused.value.reason, ref
    with pytest.raises(ApiError, match="builtin:NAME tasks only"):
        TaskSources([]).resolve("some/file.py")


def test_slow_tools_get_504_and_busy_episodes_409(tmp_path: Path):
    import asyncio
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    from cuda_agent.service.episodes import Episode, _key
    from cuda_agent.service.errors import ApiError
    from cuda_agent.service.runtime import Service
    from cuda_agent.tasks import load_task

    service = Service(ServiceConfig(allow_no_auth=True, device="cpu", root=tmp_path,
                                    tool_timeout_s=0.2, busy_timeout_s=0.2))
    service._executor = ThreadPoolExecutor(2)
    finished = threading.Event()

    def slow() -> None:
        time.sleep(0.6)
        finished.set()

    with pytest.raises(ApiError) as late:
        asyncio.run(service.run("judge", slow))
    assert late.value.status == 504 and "still be kept" in late.value.reason
    assert finished.wait(5), "the tool must run to its end"
    assert service.metrics.tools()["judge"]["errors"] == 1

    manager = service.episodes
    episode = Episode("f" * 24, load_task(TASK), "cpu", tmp_path / "e", tmp_path / "e" / "w",
                      {}, 0.0, 0.0)
    manager._episodes[_key("owner", "handle")] = episode
    with manager.use("owner", "handle"):
        with pytest.raises(ApiError) as busy, ThreadPoolExecutor(1) as other:
            other.submit(lambda: manager.use("owner", "handle").__enter__()).result()
        assert busy.value.status == 409
    with pytest.raises(ApiError) as other_owner:
        manager.get("someone-else", "handle")
    assert other_owner.value.status == 404
    service._executor.shutdown()
