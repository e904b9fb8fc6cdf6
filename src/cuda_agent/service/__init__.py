"""The environment service: agent episodes over HTTP for remote RL rollouts (docs/service.md).

    cuda-agent serve --key "$CUDA_AGENT_KEY" --device cpu
    with ServiceClient("http://127.0.0.1:8321", key) as client:
        with client.open_episode("builtin:gelu_bias_scale") as episode:
            episode.write_file("model_new.py", source); print(episode.judge()["reward"])
"""

from cuda_agent.service.app import create_app, openapi_spec
from cuda_agent.service.client import Episode, ServiceClient, ServiceError
from cuda_agent.service.config import ServiceConfig, ServiceConfigError

__all__ = ["Episode", "ServiceClient", "ServiceConfig", "ServiceConfigError", "ServiceError",
           "create_app", "openapi_spec"]
