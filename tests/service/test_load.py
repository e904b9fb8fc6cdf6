"""Eight episodes at once, each doing shell, write and read with its own marker: every
answer comes back to the episode that asked, once, and the metrics count every call."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from cuda_agent.service import ServiceClient
from tests.service.conftest import TASK

EPISODES = 8
ROUNDS = 3


def _episode(client: ServiceClient, index: int) -> list[str]:
    seen = []
    with client.open_episode(TASK) as episode:
        for round_ in range(ROUNDS):
            marker = f"episode-{index}-round-{round_}"
            episode.write_file(f"notes/{round_}.txt", marker)
            shown = episode.shell(f"cat notes/{round_}.txt; echo; ls notes | wc -l")
            lines = shown["stdout"].split()
            assert lines == [marker, str(round_ + 1)], (index, shown)
            seen.append(episode.read_file(f"notes/{round_}.txt"))
        diff = episode.diff()
        assert diff["added"] == [f"notes/{r}.txt" for r in range(ROUNDS)], diff["added"]
    return seen


def test_concurrent_episodes_get_their_own_answers(client: ServiceClient):
    before = client.metrics()["tools"]
    with ThreadPoolExecutor(EPISODES) as pool:
        results = list(pool.map(lambda i: _episode(client, i), range(EPISODES)))
    assert results == [[f"episode-{i}-round-{r}" for r in range(ROUNDS)]
                       for i in range(EPISODES)]
    after = client.metrics()
    for tool in ("write_file", "shell", "read_file"):
        grown = after["tools"][tool]["calls"] - before.get(tool, {}).get("calls", 0)
        assert grown == EPISODES * ROUNDS, tool
        assert after["tools"][tool]["p99_s"] >= after["tools"][tool]["p50_s"] > 0
    assert after["episodes"]["open"] == 0
