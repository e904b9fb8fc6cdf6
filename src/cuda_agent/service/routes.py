"""The episode routes: open, status, close, and one route per tool.

Each tool call holds its episode's lock and runs on a tool thread; a handle that is not
open (never was, closed, expired, or simply wrong) is a 404 like any other.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fastapi import APIRouter, Depends

from cuda_agent.results import to_dict
from cuda_agent.service import files
from cuda_agent.service.episodes import Episode, Judgement
from cuda_agent.service.runtime import Service
from cuda_agent.service.schemas import (
    BuildOut,
    ClosedOut,
    DiffOut,
    Entry,
    EpisodeOut,
    EpisodeStatus,
    FileOut,
    JudgementOut,
    JudgementsOut,
    ListOut,
    OpenEpisode,
    PathCall,
    RewardOut,
    ShellCall,
    ShellOut,
    VerdictOut,
    WriteCall,
    WriteOut,
)

EPISODE = "/episodes/{handle}"


def judgement_out(record: Judgement) -> JudgementOut:
    return JudgementOut(judgement_id=record.id, reward=record.reward, failure=record.failure,
                        seconds=round(record.seconds, 4),
                        result=to_dict(record.result) if record.result else None)


def episode_routes(router: APIRouter, service: Service, auth: Callable[..., str]) -> None:
    """Add the episode routes to ``router``."""
    manager, tools, config = service.episodes, service.tools, service.config
    tags = ["episodes"]
    key = Depends(auth)

    @router.post("/episodes", status_code=201, response_model=EpisodeOut, tags=tags)
    async def open_episode(body: OpenEpisode, owner: str = key) -> EpisodeOut:
        """Open an episode: a fresh workspace for the task. Keep the handle secret."""
        def call() -> EpisodeOut:
            handle, episode = manager.open(owner, body.task, body.device)
            entries, _ = files.list_entries(episode.root, ".", config.max_list_entries)
            return EpisodeOut(handle=handle, task=episode.task.name, device=episode.device,
                              files=[e.path for e in entries if e.kind == "file"])
        return await service.run("open", call)

    @router.get(EPISODE, response_model=EpisodeStatus, tags=tags)
    async def status(handle: str, owner: str = key) -> EpisodeStatus:
        """The episode's task, device, age and number of judgements."""
        def call(episode: Episode) -> EpisodeStatus:
            return EpisodeStatus(task=episode.task.name, device=episode.device,
                                 age_s=round(time.monotonic() - episode.opened, 3),
                                 judgements=len(episode.judgements))
        return await service.on_episode("status", owner, handle, call)

    @router.delete(EPISODE, response_model=ClosedOut, tags=tags)
    async def close(handle: str, owner: str = key) -> ClosedOut:
        """Close the episode and delete its workspace (waits for a call under way)."""
        episode = await service.run("close", lambda: manager.close(owner, handle))
        return ClosedOut(closed=True, judgements=len(episode.judgements))

    @router.post(EPISODE + "/shell", response_model=ShellOut, tags=tags)
    async def shell(handle: str, body: ShellCall, owner: str = key) -> ShellOut:
        """Run a shell command in the workspace, in the sandbox (output capped)."""
        result = await service.on_episode(
            "shell", owner, handle, lambda e: tools.shell(e, body.command, body.timeout_s))
        return ShellOut(**{**to_dict(result), "isolation": list(result.isolation)})

    @router.post(EPISODE + "/read_file", response_model=FileOut, tags=tags)
    async def read_file(handle: str, body: PathCall, owner: str = key) -> FileOut:
        """Read a UTF-8 text file of the workspace."""
        content, size = await service.on_episode(
            "read_file", owner, handle,
            lambda e: files.read_text(e.root, body.path, config.max_file_bytes))
        return FileOut(path=body.path, content=content, size=size)

    @router.post(EPISODE + "/write_file", response_model=WriteOut, tags=tags)
    async def write_file(handle: str, body: WriteCall, owner: str = key) -> WriteOut:
        """Create or replace a text file (the fixed files are read-only)."""
        size = await service.on_episode(
            "write_file", owner, handle,
            lambda e: files.write_text(e.root, body.path, body.content))
        return WriteOut(path=body.path, size=size)

    @router.post(EPISODE + "/list_files", response_model=ListOut, tags=tags)
    async def list_files(handle: str, body: PathCall, owner: str = key) -> ListOut:
        """Every path under a folder of the workspace (links are listed, not followed)."""
        entries, cut = await service.on_episode(
            "list_files", owner, handle,
            lambda e: files.list_entries(e.root, body.path, config.max_list_entries))
        return ListOut(path=body.path, truncated=cut,
                       entries=[Entry(path=x.path, kind=x.kind, size=x.size) for x in entries])

    @router.post(EPISODE + "/build", response_model=BuildOut, tags=tags)
    async def build(handle: str, owner: str = key) -> BuildOut:
        """Incrementally build kernels/ into cuda_extension (published to build/)."""
        result = await service.on_episode("build", owner, handle, tools.build)
        return BuildOut(ok=result.ok, result=to_dict(result))

    @router.post(EPISODE + "/verify", response_model=VerdictOut, tags=tags)
    async def verify(handle: str, owner: str = key) -> VerdictOut:
        """Build and check ModelNew against the reference (no timing; not a reward)."""
        result = await service.on_episode("verify", owner, handle, tools.verify)
        return VerdictOut(reward=result.reward, correct=result.correct, result=to_dict(result))

    @router.post(EPISODE + "/profile", response_model=VerdictOut, tags=tags)
    async def profile(handle: str, owner: str = key) -> VerdictOut:
        """Build, check and time with an operator profile (advisory; not a reward)."""
        result = await service.on_episode("profile", owner, handle, tools.profile)
        return VerdictOut(reward=result.reward, correct=result.correct, result=to_dict(result))

    @router.post(EPISODE + "/judge", response_model=JudgementOut, tags=tags)
    async def judge(handle: str, owner: str = key) -> JudgementOut:
        """Judge the workspace through the judge queue; the verdict is kept as the reward."""
        return judgement_out(await service.on_episode("judge", owner, handle, tools.judge))

    @router.get(EPISODE + "/reward", response_model=RewardOut, tags=tags)
    async def reward(handle: str, owner: str = key) -> RewardOut:
        """The reward of the last judgement (None before any)."""
        def call(episode: Episode) -> RewardOut:
            last = episode.judgements[-1] if episode.judgements else None
            return RewardOut(reward=last.reward if last else None,
                             judgements=len(episode.judgements),
                             last=judgement_out(last) if last else None)
        return await service.on_episode("reward", owner, handle, call)

    @router.get(EPISODE + "/judgements", response_model=JudgementsOut, tags=tags)
    async def judgements(handle: str, owner: str = key) -> JudgementsOut:
        """Every judgement of the episode, oldest first."""
        records = await service.on_episode("judgements", owner, handle,
                                           lambda e: list(e.judgements))
        return JudgementsOut(judgements=[judgement_out(r) for r in records])

    @router.get(EPISODE + "/diff", response_model=DiffOut, tags=tags)
    async def diff(handle: str, owner: str = key) -> DiffOut:
        """Unified diff of the workspace's text files against their state at open."""
        result = await service.on_episode(
            "diff", owner, handle,
            lambda e: files.diff(e.baseline, files.text_files(e.root), config.max_diff_bytes))
        return DiffOut(diff=result.diff, added=list(result.added),
                       removed=list(result.removed), changed=list(result.changed),
                       truncated=result.truncated)
