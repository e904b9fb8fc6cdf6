"""Configuration of the judge: one object, every field documented."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from cuda_agent.build.builder import BuildConfig

JUDGE_VERSION = "judge-v21"
"""Bump whenever correctness, timing or reward rules change; results record it. One line
per version: docs/judge-versions.md."""


class JudgeConfig(BaseModel):
    """How a candidate is checked and timed."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Where to run: 'auto' takes CUDA when a GPU is present.")
    seed: int | None = Field(
        None, description="Base seed; trial i draws its inputs with seed + i. None draws a "
        "secret random seed per judgement (recorded in the result).")
    trials: int = Field(5, ge=1, description="Correctness trials, each with fresh inputs.")
    scales: tuple[float, ...] = Field(
        (0.25, 4.0), description="Extra trials with floating inputs multiplied by these.")
    float64_check: bool = Field(True, description="Judge precision against float64.")
    check: bool = Field(True, description="Compare outputs with the reference.")
    check_budget_s: float | None = Field(
        None, gt=0, description="The time the checked calls may take, estimated from the "
        "reference's first call (each checked call about 3 reference calls, each float64 "
        "twin 3 more); over it fewer are checked (judge.budget: twins for the first checked "
        "call only, then one call at scale 1 and the first scaled one, the first keeping "
        "its float64 twin) and the verdict says so. None: no limit. The agent's own verify "
        "and profile take 8 s (in_episode): a task whose call takes a second on the CPU "
        "would spend over a minute on its seven checked calls and their twins.")
    time: bool = Field(True, description="Time the candidate and the eager baseline.")
    time_compile: bool = Field(True, description="Also time the torch.compile baseline.")
    warmup: int = Field(
        3, ge=0, description="Untimed calls before timing; fewer (at least one) once they "
        "took warmup_budget_s by the judge's clock. The judge ends the warm-up by its own "
        "count and clock, whatever the worker asks.")
    warmup_budget_s: float = Field(
        0.5, gt=0, description="The warm-up's calls' own time (the judge's clock) after which "
        "it ends, from its first call on (on CUDA, not before 0.2 s): a call that long is "
        "warm after its first (lazy set-up, the allocator's blocks, a torch.compile "
        "baseline's compilation), and three of them would cost seconds on a large CPU task.")
    min_runs: int = Field(
        50, ge=1, description="Timed calls before the median's interval may end the timing "
        "(a shorter run's interval is too coarse to trust); the budget may end it sooner, "
        "from floor_runs on.")
    floor_runs: int = Field(
        5, ge=1, description="Timed calls at least, however long they take (at most "
        "min_runs): the judge refuses to end the timed phase sooner, whatever the worker "
        "asks. With time_budget_s it bounds a slow call's timing: about "
        "max(floor_runs x call, time_budget_s + call), for candidate and baselines alike.")
    max_runs: int = Field(500, ge=1, le=20_000, description="Timed calls at most.")
    time_budget_s: float = Field(
        2.0, gt=0, description="The timed calls' own time after which timing ends, tight or "
        "not, once floor_runs calls are made: each call's time from the judge sending it to "
        "its done, by the judge's clock (the time between calls is not counted, so a worker "
        "idling there spends none of it). The judge holds the worker to it: before min_runs "
        "the timed phase ends only once this is spent. 2 s keeps a CPU profile of a task "
        "whose call takes 1-2 s within a minute (docs/judge.md, 'Timing').")
    target_rel_ci: float | None = Field(
        None, gt=0, description="Stop once the median's 95% CI half-width is this fraction "
        "(from min_runs calls on). None: 0.002 on CUDA (device time is steady enough between "
        "processes that a tighter interval pays), 0.005 on CPU (wall time).")
    cache_baselines: bool = Field(True, description="Reuse cached eager/compile timings.")
    store_baselines: bool = Field(
        True, description="Write baselines this judge measured to the shared cache. Off for "
        "the agent's own calls (in_episode): what they measure may overlap the agent's own "
        "commands, so it stays with that judge (its memory) and no reward reads it.")
    baseline_processes: int | None = Field(
        None, ge=1, description="Fresh processes each baseline (eager, torch.compile) is "
        "timed in at most, pooled by timing.pooled; a kind stops adding them once two or "
        "more medians agree within 2 x target_rel_ci. A 50-90 us kernel's median moves by "
        "0.15-0.35% "
        "from one process to the next on an H100 while each process's own interval is 0.2%; "
        "a cached baseline keeps its process's offset for every later speed-up. None: 5 on "
        "CUDA (paid once per cached task), 1 on CPU.")
    candidate_processes: int | None = Field(
        None, ge=1, description="Fresh (confined) processes the candidate is timed in: the "
        "first verifies and times, each other one times again (its timed outputs re-checked, "
        "its clock cross-checked, its threads and streams watched the same way); the runtime "
        "is pooled like the baselines'. A process's median carries an offset of its own, so "
        "more processes narrow the runtime: its spread over 3-5 judgements on H100s "
        "(KernelBench 1/12 and 1/40, a calibrated spin kernel) was 0.03-0.68% with 4 "
        "split processes, 0.08-0.49% with 8 "
        "(docs/benchmarks.md, 'Judge-v13', 'Judge-v14 on the GPU'). None: 8 on CUDA, 1 "
        "on CPU. The agent's own verify and profile calls take 1 unless told otherwise "
        "(in_episode): each extra process adds 0.4-0.6 s. Past 256 MiB of timed outputs "
        "the extra processes are staged one at a time.")
    settle_processes: bool = Field(
        True, description="Time the candidate in no more of its processes once more could "
        "not change its reward: from two processes on, the next one is not started when the "
        "pooled time (held to the judge's clock) lies further than 3 x the processes' "
        "spread, and 2% of the threshold, from every milestone (faster_margin x eager and x "
        "torch.compile). A candidate near a milestone gets all candidate_processes; one far "
        "from them is timed in 2 (its runtime then carries two processes' offsets, "
        "0.15-0.35% each on an H100). False: always candidate_processes.")
    split_timing: bool = Field(
        True, description="With n > 1 candidate processes, spend the candidate's timing "
        "across them: each stops once its median's interval is target_rel_ci x sqrt(n) "
        "(pooled, about as tight as one process at target_rel_ci; from 3 on the pool keeps "
        "n - 2 medians, so somewhat wider), and the extra processes warm up for 10 calls and "
        "0.05 s (the GPU is warm from the process before). Each process's own offset, not "
        "its interval, is what more processes average away.")
    activity_record: bool = Field(
        True, description="On CUDA, after the candidate's timed calls, record the device's "
        "own activity (CUPTI, through torch's profiler) over 32 further calls through the "
        "same gate, none of them timed, and fail a candidate whose work on another stream "
        "outlived any of them, however short (docs/judge.md, 'The device's activity "
        "record'). The timed calls are not recorded: on an H100, recording made a kernel of "
        "one full wave at full occupancy take 20-30% longer. Where the profiler cannot "
        "record, the timer's own check stands alone (the result carries a flag).")
    clock_margin: float = Field(
        0.10, ge=0, description="A time the candidate's process measured is held to the "
        "judge's own clock: it may be at most this fraction under the judge's median time of "
        "the wall calls (less clock_slack_ms), else that bound is used and the verdict says "
        "so (docs/judge.md, 'What the judge trusts', and its limits, in numbers).")
    clock_slack_ms: float = Field(
        1.0, ge=0, description="The absolute part of the judge's clock bound (ms): what a "
        "call's messages and the host's path to its first kernel add to the judge's time of "
        "it. On an H100 the judge's median of the wall calls read 0.2-0.6 ms over the device "
        "time of honest 0.05-0.3 ms kernels, so a tighter slack would raise honest times. "
        "Applies to device times; wall times take clock_slack_wall_ms.")
    clock_slack_wall_ms: float = Field(
        0.05, ge=0, description="The absolute part of the judge's clock bound on a wall time "
        "(the CPU) (ms). The stand-in calls already take the messages' cost out of the "
        "judge's time, and no device lies between, so only timer jitter is left: a slack as "
        "wide as clock_slack_ms would let a ms-scale CPU call report a fraction of its time.")
    trusted_rel_ci: float = Field(
        0.1, gt=0, description="A reward above 1 needs a speed-up noise cannot explain "
        "(judge.trust): the candidate's and the baseline's 95% intervals each within this "
        "fraction of their medians (half-width), on the CPU the judge's clock's interval "
        "too (plus clock_slack_wall_ms), and the speed-up's interval wholly above 1. "
        "Otherwise the verdict is correct, the speed-up not counted, and a 'timing "
        "unreliable' reason names the widths and the load. A baseline past it is not "
        "cached. A quiet machine's intervals are a few percent at most (a run at "
        "floor_runs spans its calls' whole range); a loaded one's reach several times the "
        "median.")
    baseline_check_s: float | None = Field(
        0.25, gt=0, description="A cached baseline is held, in every judgement that reads "
        "it, to a fresh check: the held reference's calls timed again, ending from 5 calls "
        "on once they took this long by the judge's clock (at most baseline_check_calls). "
        "Where the cached eager interval and the check's, each widened by trusted_rel_ci, do "
        "not overlap (a figure measured on a loaded machine read on a quiet one, or the "
        "reverse), both baselines are measured again (judge.recheck). None: cached baselines "
        "are used unchecked.")
    baseline_check_calls: int = Field(
        20, ge=5, description="Timed calls of the fresh check at most (above).")
    keep_warm: bool = Field(
        False, description="Start the next judgement's worker processes as soon as a "
        "judgement takes its own, so they start up while it runs and repeated judgements skip "
        "interpreter start-up (call Judge.close() when done). On the CPU they start when a "
        "judgement ends: their start-up would compete with its build and timed calls.")
    warm_sets: int = Field(
        1, ge=1, le=4, description="With keep_warm, the sets of worker processes (a "
        "reference and the candidate's) kept started. Two let a call made right after "
        "another (an agent's profile after its verify) find a set that finished starting "
        "while the first ran; each costs its processes' memory (on CUDA their contexts).")
    confine: Literal["auto", "on", "off"] = Field(
        "auto", description="Confine the candidate's process in namespaces of its own "
        "(read-only file system, private /tmp, no network, own pid namespace). 'auto': where "
        "the OS allows (results say which in `isolation`); 'on': refuse to judge otherwise.")
    output_budget_gb: float = Field(
        8.0, gt=0, description="Checked outputs (trial outputs, float64 twins, timed "
        "outputs) the reference reports at most, in GiB; over it fewer are checked, at "
        "least two trials and one timed set (judge.budget), and the verdict says so.")
    gpu_lock: str | None = Field(
        None, description="The GPU's turn, shared by the judges on one GPU (judge.gpu_turn: "
        "this file and .gate, .intent, .baselines beside it): held exclusive through every "
        "timed phase (stand-ins, warm-up's end to tail's end, baselines included) and shared "
        "through the other GPU work, so no timing overlaps another judge's GPU work while "
        "untimed work overlaps. None: no lock (the judge has the GPU to itself). The pool "
        "sets it for jobs_per_gpu > 1.")
    memory_limit_gb: float | None = Field(
        None, gt=0, description="Address-space limit of each CPU worker, in GiB: an "
        "allocation past it fails in that worker, and a reference that does not fit ends "
        "the judgement with one line saying so. None: taken from the machine (judge.memory): "
        "3/4 of its physical memory split evenly between the workers alive at once (the held "
        "reference, candidate_processes and one baseline: 3 on the CPU by default), at "
        "least 2 GiB.")
    cpu_size: Literal["auto", "reduced", "full"] = Field(
        "auto", description="The size a task is judged at on the CPU (judge.cpu_size): "
        "'auto' judges it at its own size where a call fits the CPU workers' memory limit, "
        "else at a reduced size, its module-level size constants halved (largest first) "
        "until a call is within cpu_call_mb and cpu_call_gflop; 'reduced' reduces any task "
        "over those caps; 'full' never reduces. The verdict names every constant changed; "
        "reference and candidate run the same reduced task.")
    cpu_call_mb: float = Field(
        64.0, gt=0, description="A reduced task's call at most: its inputs, outputs and "
        "weights, in MiB. The checks compare every element of several calls' outputs, in "
        "float64 too, so this bounds the judgement's time as well as its memory.")
    cpu_call_gflop: float = Field(
        4.0, gt=0, description="A reduced task's call at most, in floating-point operations "
        "(GFLOP) as torch's flop counter sees them (matrix products, convolutions, "
        "attention), for the reference, its float64 twin and a plain kernel alike.")
    floor_margin: float = Field(
        0.8, description="Flag a runtime under this fraction of the memory-traffic floor.")
    process_timeout_s: float = Field(600.0, gt=0, description="Limit for each worker process.")
    atol: float | None = Field(None, description="Absolute tolerance; default per dtype.")
    rtol: float | None = Field(None, description="Relative tolerance; default per dtype.")
    shape: str | None = Field(
        None, description="For a task declaring INPUT_SHAPES: judge this shape alone. None: "
        "every declared shape (correct at all, times summed, the lowest shape's reward).")
    faster_margin: float = Field(0.95, description="Faster means runtime < margin x baseline.")
    build: BuildConfig = Field(default_factory=BuildConfig, description="Kernel build options.")

    def baseline_processes_for(self, device: str) -> int:
        """``baseline_processes`` as it applies on ``device``."""
        if self.baseline_processes is not None:
            return self.baseline_processes
        return 5 if device.startswith("cuda") else 1

    def candidate_processes_for(self, device: str) -> int:
        """``candidate_processes`` as it applies on ``device`` (1 when not timing)."""
        if not self.time:
            return 1
        if self.candidate_processes is not None:
            return self.candidate_processes
        return 8 if device.startswith("cuda") else 1

    def rel_ci_for(self, device: str) -> float:
        """``target_rel_ci`` as it applies on ``device``."""
        if self.target_rel_ci is not None:
            return self.target_rel_ci
        return 0.002 if device.startswith("cuda") else 0.005


IN_EPISODE = {"candidate_processes": 1, "baseline_processes": 2, "store_baselines": False,
              "check_budget_s": 8.0, "target_rel_ci": 0.01, "time_budget_s": 1.0,
              "baseline_check_s": 0.1, "baseline_check_calls": 10}
"""What the agent's own verify and profile calls (its tools, the workspace's commands, the
MCP server's and the service's) change in a judge's settings: the candidate timed in one
process and each baseline in two at most, to a 1% interval within a second of timed calls
(the agent compares its own edits; the verdict's 0.2% on CUDA is the final judgement's,
and its baselines' 5 processes), so that a new task's baselines start few processes at
once beside the episode's workers, and an edited kernel is
built, checked and timed in seconds (a cached baseline's fresh check: 10 calls or 0.1 s
from 5 calls on), and on a task whose call takes seconds fewer calls
checked (at least one at scale 1 with its float64 twin and one scaled), so that verify
stays within 30 s. The final judgement, evaluation and rewards keep the steadier, fuller
default."""


def in_episode(config: JudgeConfig) -> JudgeConfig:
    """``config`` for a verify or profile call inside an episode: ``IN_EPISODE``'s settings
    where ``config`` did not set them itself."""
    update = {k: v for k, v in IN_EPISODE.items() if k not in config.model_fields_set}
    return config.model_copy(update=update) if update else config
