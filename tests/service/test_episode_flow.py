"""A whole episode over HTTP through the client: a wrong solution is judged -1, the shipped
CPU solution builds, verifies and is judged >= 1, every judgement is kept, the diff shows
the edits, and closing deletes the workspace."""

from __future__ import annotations

import pytest

from cuda_agent.service import ServiceClient, ServiceError
from tests.service.conftest import TASK, Running, solution_files


@pytest.mark.slow
def test_episode_from_wrong_to_rewarded(client: ServiceClient, service: Running):
    with client.open_episode(TASK, "cpu") as episode:
        assert episode.info["task"] == "gelu_bias_scale" and episode.info["device"] == "cpu"
        assert {"SKILL.md", "model.py", "model_new.py"} <= set(episode.info["files"])
        assert episode.reward() == {"reward": None, "judgements": 0, "last": None}
        for path, text in solution_files(wrong=True).items():
            assert episode.write_file(path, text) == len(text.encode())
        wrong = episode.judge()
        assert wrong["reward"] == -1 and not wrong["result"]["correct"], wrong
        assert episode.reward()["reward"] == -1

        honest = solution_files()
        episode.write_file("model_new.py", honest["model_new.py"])
        assert episode.read_file("model_new.py") == honest["model_new.py"]
        built = episode.build()
        assert built["ok"], built["result"]["diagnostics"]
        assert any(e["path"].startswith("build/cuda_extension")
                   for e in episode.list_files("build"))
        verified = episode.verify()
        assert verified["correct"] and verified["reward"] >= 1, verified["result"]["reasons"]
        assert episode.reward()["reward"] == -1, "verify is not a judgement"

        judged = episode.judge()
        assert judged["failure"] is None and judged["reward"] >= 1, judged
        assert judged["result"]["correct"] and judged["result"]["task"] == "gelu_bias_scale"
        reward = episode.reward()
        assert reward["reward"] == judged["reward"] and reward["judgements"] == 2
        assert reward["last"]["judgement_id"] == judged["judgement_id"]
        history = episode.judgements()
        assert [j["judgement_id"] for j in history] == [wrong["judgement_id"],
                                                        judged["judgement_id"]]
        assert [j["reward"] for j in history] == [-1, judged["reward"]]

        diff = episode.diff()
        assert "kernels/gelu_bias_scale.cpp" in diff["added"]
        assert "model_new.py" in diff["changed"] and not diff["truncated"]
        assert "+++ b/kernels/gelu_bias_scale.cpp" in diff["diff"]
        assert not any(p.startswith("build/") for p in diff["added"])
        assert [p for p in service.root.iterdir() if p.is_dir()]
        assert episode.close() == {"closed": True, "judgements": 2}
    assert not [p for p in service.root.iterdir() if p.is_dir()], "workspace not deleted"
    with pytest.raises(ServiceError) as gone:
        episode.reward()
    assert gone.value.status == 404


def test_shell_runs_in_the_sandbox_with_limits(client: ServiceClient):
    with client.open_episode(TASK) as episode:
        ran = episode.shell("ls && echo done >&2 && exit 3")
        assert ran["exit_code"] == 3 and "model_new.py" in ran["stdout"]
        assert ran["stderr"].strip() == "done" and not ran["timed_out"]
        slow = episode.shell("sleep 30", timeout_s=0.5)
        assert slow["timed_out"] and slow["killed_reason"] == "timeout"
        loud = episode.shell("head -c 100000 /dev/zero | tr '\\0' x")
        assert loud["truncated"] and len(loud["stdout"]) == 4096
        outside = episode.shell("touch /usr/escape 2>/dev/null; echo $?")
        if "mount" in outside["isolation"]:
            assert outside["stdout"].strip() != "0"
        made = episode.shell("mkdir -p notes && echo hi > notes/a.txt")
        assert made["exit_code"] == 0 and episode.read_file("notes/a.txt") == "hi\n"
        assert "notes/a.txt" in episode.diff()["added"]
