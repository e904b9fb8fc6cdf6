"""The README's commands run as a user types them, on the CPU.

Every shell command in README.md's fenced ``bash``/``sh``/``console`` blocks is a test of its
own: it runs with bash in a fresh folder, with a fresh CUDA_AGENT_HOME, where `cuda-agent` (and
`.venv/bin/cuda-agent`, as the quick start names it) is `python -m cuda_agent` from this
interpreter and this checkout. Nothing in the command is rewritten; only the judge's and the
filters' settings are made quick with `--set` where the command takes it. A command runs unless
SKIP names it with a reason, so a command added to the README is tested by default. Each command
must exit as the README's convention says (0 done, 1 refused or failed, 2 bad input) and leave
what the README says it leaves. Every command of docs/*.md's shell blocks runs the same way,
unless SKIP names it with a reason (a GPU, the network, an LLM, a server that runs until
stopped, a placeholder the reader fills in).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import README_OPTIMIZE, OptimizeRun

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

pytestmark = pytest.mark.docs

# Commands not run, keyed by their text as the README writes it (continuations joined).
SKIP: dict[str, str] = {
    "bash scripts/setup.sh": "installs torch and the package into .venv (network)",
    "bash scripts/test.sh": "runs the whole test suite, this file included",
    "cuda-agent workspace init ../shared/kernelbench/kernelbench.jsonl::1/12 ws --device cuda":
        "needs a GPU and a KernelBench copy",
    "ws/utils/build": "builds the CUDA workspace of the skipped `workspace init --device cuda`",
    "ws/utils/verify": "needs a GPU (the CUDA workspace above)",
    "ws/utils/profile": "needs a GPU (the CUDA workspace above)",
    "cuda-agent judge ../shared/kernelbench/kernelbench.jsonl::1/12 ws --json":
        "needs a GPU and a KernelBench copy",
    "cuda-agent synth --count 6000 --out runs/ops6k --device cuda --workers 8 "
    "--kernelbench ../shared/kernelbench/kernelbench.jsonl": "needs a GPU; takes hours",
    "cuda-agent optimize task/model.py --model openai:NAME --base-url URL --out run":
        "needs an LLM endpoint",
    "cuda-agent export run --name fast_rmsnorm --out dist/fast_rmsnorm":
        "exports the run of the skipped `optimize --model openai:NAME`",
    # docs/agent.md
    "cuda-agent optimize model.py --model openai:NAME --base-url http://host:8000/v1":
        "needs an LLM endpoint",
    "cuda-agent optimize ../shared/kernelbench/kernelbench.jsonl::1/19 --model hf:/models/coder":
        "needs a local model's weights and a KernelBench copy",
    # docs/evaluation.md
    "cuda-agent eval shared/kernelbench/kernelbench.jsonl answers/ --out runs/eval1":
        "needs a KernelBench copy and answers to it (GPU-sized tasks)",
    "cuda-agent eval tasks/ answers/ --out runs/x --gpus 0,1 --set pool.judge.time_budget_s=5":
        "needs two GPUs",
    "cuda-agent eval compare runs/eval1 runs/eval2":
        "compares two runs of the skipped KernelBench eval",
    "cuda-agent eval report runs/eval1 --audit runs/audit":
        "reads the skipped KernelBench eval and audit",
    "cuda-agent baselines shared/kernelbench/kernelbench.jsonl --levels 1,2 --out runs/base":
        "times KernelBench's GPU-sized levels 1-2 (hours on the CPU)",
    "cuda-agent synth audit shared/kernelbench/kernelbench.jsonl --out runs/audit --no-compile":
        "audits every KernelBench task (needs the copy; tens of minutes)",
    "cuda-agent eval TASKS answers/ --out runs/eval2 --audit runs/audit":
        "TASKS is a placeholder for the reader's task file",
    "CUDA_VISIBLE_DEVICES=1 cuda-agent baselines KB.jsonl --out runs/base1 --shard 1/4 "
    "--time-limit 400": "needs a GPU; KB.jsonl is a placeholder",
    "for k in 0 1 2; do CUDA_VISIBLE_DEVICES=0 cuda-agent baselines KB.jsonl --out runs/b$k "
    "--shard $k/3 --set judge.gpu_lock=/tmp/gpu0.lock & done; wait":
        "needs a GPU; KB.jsonl is a placeholder",
    "cuda-agent baselines KB.jsonl --out runs/base --report-only":
        "reports the skipped sharded runs; KB.jsonl is a placeholder",
    # docs/integrate.md
    "cuda-agent export runs/mlp --name fast_mlp --out dist/fast_mlp":
        "exports an optimize run (runs/mlp) of an LLM policy",
    "pip install --no-build-isolation dist/fast_mlp": "installs the skipped export (network)",
    "pytest dist/fast_mlp/tests": "tests the skipped export",
    # docs/mcp.md, docs/pool.md, docs/policies.md, docs/sandbox.md
    "vllm serve Qwen/Qwen2.5-Coder-7B-Instruct --port 8000 --enable-auto-tool-choice "
    "--tool-call-parser hermes": "a model server: a GPU and the model's weights",
    "python -m sglang.launch_server --model-path Qwen/Qwen2.5-Coder-7B-Instruct --port 8000 "
    "--tool-call-parser qwen25": "a model server: a GPU and the model's weights",
    "cuda-agent ... --model openai:Qwen/Qwen2.5-Coder-7B-Instruct --base-url http://host:8000/v1":
        "a pattern ('...' is any command), and needs the model server above",
    "pytest -q tests/agent/test_policies.py": "a file of this test suite, which CI runs itself",
    ".venv/bin/python -m pytest tests/execution -q": "a folder of this test suite, which CI "
                                                     "runs itself",
    "ray start --head --port=6379": "starts a Ray cluster's head, which runs until stopped",
    "ray start --address=HEAD_IP:6379": "joins a Ray cluster; HEAD_IP is a placeholder",
    # docs/service.md: a server that runs until stopped, and requests to it
    "export CUDA_AGENT_API_KEYS=\"$(python -c 'import secrets; "
    "print(secrets.token_urlsafe(32))')\"":
        "sets a variable in the reader's shell for the server below; alone it leaves nothing",
    "cuda-agent serve --device cpu --workers 2":
        "a server that runs until stopped (tests/service start it in-process)",
    "cuda-agent serve --device cuda --host 127.0.0.1": "needs a GPU; a server",
    "cuda-agent serve --key K1 --key K2 --root /scratch/episodes --max-episodes 128 --set "
    "pool.judge.trials=3 --set sandbox.timeout_s=30 --set task_roots='[\"/data/tasks\"]'":
        "a server that runs until stopped, under folders of the reader's machine",
    # docs/synthesis.md
    "cuda-agent synth check task.py --json [--kernelbench KB.jsonl] [--device cuda]":
        "a syntax line: [...] marks optional parts (README's `synth check model.py` runs)",
    "cuda-agent synth audit ../shared/kernelbench/kernelbench.jsonl --out runs/audit":
        "audits every KernelBench task (needs the copy; tens of minutes)",
    # docs/training.md
    "cuda-agent rollout tasks/level1.jsonl --model openai:MODEL --base-url "
    "http://host:8000/v1 --out runs/r1 --episodes-per-task 8 --parallel 4 --device cuda":
        "needs an LLM endpoint and a GPU",
}
# Commands another test already runs as typed, or whose cost CI does not pay twice.
SKIP.update({
    "cuda-agent optimize": "the README's `.venv/bin/cuda-agent optimize` above runs it",
    ".venv/bin/cuda-agent optimize": "run once per test run (conftest's builtin_replay_run, "
    "which the optimize and training tests read too) and checked by test_readme_quick_start",
    "cuda-agent synth catalog": "crawls torch's operators (about 2 minutes on 2 cores); "
        "tests/synth/test_catalog.py builds the catalog",
    "cuda-agent rollout builtin:gelu_bias_scale --model replay:builtin --out runs/r0 "
    "--device cpu": "tests/train/test_rollout.py::test_cli_rollout_and_rerun runs rollout "
        "from the CLI",
})
SERVICE_REQUEST = "the service's HTTP API: needs the server above running, with a key"

# Judge settings that keep a command cheap, appended where the command takes --set.
QUICK_JUDGE = ["--set", "trials=2", "--set", "time_compile=false", "--set", "time_budget_s=0.3"]
QUICK_TOOLS = [a.replace("--set", "--tool-set") for a in QUICK_JUDGE]
# The filters' runtime window is a property of the machine; CI checks the verdict is printed.
QUICK_CHECK = ["--set", "compile_check=false", "--set", "timing_runs=2",
               "--set", "min_ms_cpu=0", "--set", "max_ms_cpu=100000"]
QUICK_SYNTH = ["--set", "filters.compile_check=false", "--set", "filters.timing_runs=2"]
QUICK_POOL = [a.replace("trials", "pool.judge.trials").replace("time_", "pool.judge.time_")
              for a in QUICK_JUDGE]
QUICK: dict[str, list[str]] = {
    ".venv/bin/cuda-agent optimize": QUICK_JUDGE + QUICK_TOOLS,
    "cuda-agent eval builtin:gelu_bias_scale answers/ --out runs/cpu --device cpu "
    "--cpu-workers 2": QUICK_POOL,
    "cuda-agent synth --count 30 --out runs/ops30": QUICK_SYNTH,
    "cuda-agent synth check model.py --json": QUICK_CHECK,
}

# Commands that take more than about a minute on a 2-core machine.
SLOW = {"cuda-agent synth --count 30 --out runs/ops30"}

# A user's package for `cuda-agent extract`: a decoder whose layers hold an input_layernorm.
MYPKG_MODEL = '''
import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class Layer(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.mlp = nn.Linear(dim, dim)

    def forward(self, x):
        return x + self.mlp(self.input_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, dim, layers):
        super().__init__()
        self.embed_tokens = nn.Embedding(32000, dim)
        self.layers = nn.ModuleList(Layer(dim) for _ in range(layers))

    def forward(self, ids):
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return x


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Decoder(64, 2)

    def forward(self, ids):
        return self.model(ids)


def build():
    return LM().eval()
'''


def _mypkg(folder: Path) -> None:
    """The user's package of README's and docs/integrate.md's `extract` commands."""
    (folder / "mypkg").mkdir()
    (folder / "mypkg" / "__init__.py").write_text("")
    (folder / "mypkg" / "model.py").write_text(MYPKG_MODEL + "\n\nbuild_model = build\n")
    (folder / "mypkg" / "blocks.py").write_text("from mypkg.model import Layer as Block\n")


def _episode(folder: Path) -> None:
    """runs/ep0.jsonl: a short episode's trajectory, as the agent records one."""
    from cuda_agent.agent.trajectory import Recorder
    from cuda_agent.agent.types import EpisodeResult, Message

    (folder / "runs").mkdir()
    recorder = Recorder(folder / "runs" / "ep0.jsonl")
    recorder.episode_start("gelu_bias_scale", "replay:builtin", {})
    recorder.message(Message("user", "Make the model faster."))
    recorder.message(Message("assistant", "Nothing to change."))
    recorder.episode_end(EpisodeResult("gelu_bias_scale", "replay:builtin", "done", 1, 10, 5,
                                       0.1, None, None))
    recorder.close()


def _cpu_workspace(folder: Path) -> None:
    """ws: made by docs/mcp.md's own first command (its task kept in the same home)."""
    done = run_command("cuda-agent workspace init builtin:gelu_bias_scale ws --device cpu",
                       folder)
    assert done.returncode == 0, done.stderr


def _answers(folder: Path) -> None:
    """answers/: the shipped CPU solution of the built-in example, as a workspace."""
    solution = REPO / "src" / "cuda_agent" / "examples" / "gelu_bias_scale" / "solution"
    shutil.copytree(solution / "cpu", folder / "answers" / "gelu_bias_scale")


def _model_py(folder: Path) -> None:
    example = REPO / "src" / "cuda_agent" / "examples" / "gelu_bias_scale" / "model.py"
    (folder / "model.py").write_text(example.read_text())


def _docs_folder(folder: Path) -> None:
    (folder / "docs").mkdir()


# What a command's folder holds before it runs: the files the README assumes the user has.
GIVEN: dict[str, Callable[[Path], None]] = {
    "cuda-agent synth check model.py --json": _model_py,
    'cuda-agent extract mypkg.model:build -i "long[2,128]:0..32000" '
    '-c "model.layers.*.input_layernorm" -o task': _mypkg,
    "cuda-agent serve --print-openapi > docs/service-openapi.json": _docs_folder,
    **{f"cuda-agent trajectories show runs/ep0.jsonl{flag}": _episode
       for flag in ("", " --full", " --json")},
    **{command: _mypkg for command in (
        "cuda-agent extract mypkg.model:build_model --child model.layers.0.mlp --inputs "
        "'long[2,16]:0..32000' --out extracted/mlp",
        "cuda-agent extract mypkg.model:build_model --child 'model.layers.*.input_layernorm' "
        "--inputs 'long[2,16]:0..32000' --inputs 'long[1,512]:0..32000'",
        "cuda-agent extract mypkg.blocks:Block --init-args '[64]' --inputs 'float32[2,16,64]'",
        "cuda-agent extract mypkg.model:build_model --inputs 'long[2,16]:0..32000' --rank "
        "--top 20")},
    "cuda-agent mcp ws": _cpu_workspace,
    "cuda-agent mcp ws --set trials=2 --set time_compile=false": _cpu_workspace,
    "cuda-agent eval builtin:gelu_bias_scale answers/ --out runs/cpu --device cpu "
    "--cpu-workers 2": _answers,
}


def _synthesized(folder: Path, out: str) -> None:
    data = folder / "runs" / "ops30"
    assert len((data / "jsonl" / "train.jsonl").read_text().splitlines()) == 30
    assert (data / "data" / "train.parquet").is_file()
    assert "30 tasks in runs/ops30" in out


def _checked(folder: Path, out: str) -> None:
    verdict = json.loads(out)
    assert verdict["accepted"] is True and "checks" in verdict


def _extracted(folder: Path, out: str) -> None:
    assert {"model.py", "extract.json"} <= {p.name for p in (folder / "task").iterdir()}


def _workspace(folder: Path, out: str) -> None:
    names = {p.name for p in (folder / "ws").iterdir()}
    assert {"SKILL.md", "model.py", "model_new.py", "kernels", "utils"} <= names


def _baselines(folder: Path, out: str) -> None:
    assert "1 of 1 tasks done" in out
    assert (folder / "runs" / "base-cpu" / "baselines.jsonl").is_file()


def _openapi(folder: Path, out: str) -> None:
    written = json.loads((folder / "docs" / "service-openapi.json").read_text())
    assert written == json.loads((REPO / "docs" / "service-openapi.json").read_text())


# What the README says a command prints or leaves behind.
SHOWS: dict[str, Callable[[Path, str], None]] = {
    "cuda-agent synth --count 30 --out runs/ops30": _synthesized,
    "cuda-agent synth check model.py --json": _checked,
    'cuda-agent extract mypkg.model:build -i "long[2,128]:0..32000" '
    '-c "model.layers.*.input_layernorm" -o task': _extracted,
    "cuda-agent workspace init builtin:gelu_bias_scale ws --device cpu": _workspace,
    "cuda-agent serve --print-openapi > docs/service-openapi.json": _openapi,
    "cuda-agent baselines builtin:gelu_bias_scale --out runs/base-cpu --device cpu --no-compile":
        _baselines,
}

# Exit status other than 0 (the convention: 1 refused or failed, 2 bad input).
EXIT: dict[str, int] = {}


FENCE = re.compile(r"^```(bash|sh|console)\n(.*?)^```", re.S | re.M)


def blocks(markdown: str) -> list[tuple[str, list[str]]]:
    """The shell commands of a markdown text's shell blocks, each with the output the text
    shows for it: continuations joined, comments dropped, `a && b` split into its commands.
    In a console block a command follows the prompt `$ ` and the lines after it, up to the
    next prompt, are its output."""
    found: list[tuple[str, list[str]]] = []
    for language, block in FENCE.findall(markdown):
        first = len(found)
        for line in block.replace("\\\n", " ").splitlines():
            if language == "console" and not line.startswith("$ "):
                if len(found) > first and line.strip():
                    found[-1][1].append(line.strip())
                continue
            line = re.sub(r"(^|\s)#.*$", "", line.removeprefix("$ ")).strip()
            found += [(" ".join(part.split()), []) for part in line.split(" && ") if part.strip()]
    return found


def commands(markdown: str) -> list[str]:
    return [command for command, _ in blocks(markdown)]


def _readme_commands() -> list[str]:
    return commands(README.read_text())


def _doc_commands() -> list[str]:
    """The commands of docs/*.md's shell blocks, each once."""
    return [c for doc in sorted((REPO / "docs").glob("*.md")) for c in commands(doc.read_text())]


def skip_reason(command: str) -> str | None:
    """Why a documented command is not run here (None: it runs)."""
    if command.startswith(("curl ", "H=$(curl ")):
        return SERVICE_REQUEST
    return SKIP.get(command)


def _cases() -> list:
    cases = []
    for command in dict.fromkeys(_readme_commands() + _doc_commands()):
        marks = [pytest.mark.slow] if command in SLOW else []
        if (reason := skip_reason(command)) is not None:
            marks.append(pytest.mark.skip(reason=reason))
        cases.append(pytest.param(command, marks=marks, id=command[:80]))
    return cases


def run_command(command: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """Run COMMAND with bash in FOLDER, `cuda-agent` being this checkout's package."""
    home, bins = folder.parent / "home", [folder.parent / "bin", folder / ".venv" / "bin"]
    for bin_dir in bins:
        bin_dir.mkdir(parents=True, exist_ok=True)
        shim = bin_dir / "cuda-agent"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cuda_agent "$@"\n')
        shim.chmod(0o755)
    # on the CPU as this file says, on a GPU machine too (CUDA is the device tests' part)
    env = dict(os.environ, CUDA_AGENT_HOME=str(home), PYTHONPATH=str(REPO / "src"),
               PATH=f"{bins[0]}{os.pathsep}{os.environ['PATH']}", CUDA_VISIBLE_DEVICES="")
    env.pop("CUDA_AGENT_TEST_HOME", None)
    line = " ".join([command, *QUICK.get(command, [])])
    if ">" in command:  # a redirection stays last
        head, _, target = command.partition(">")
        line = " ".join([head.strip(), *QUICK.get(command, []), ">", target.strip()])
    return subprocess.run(["bash", "-c", line], cwd=folder, env=env, text=True,
                          capture_output=True, check=False, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", _cases())
def test_documented_command(command: str, tmp_path: Path) -> None:
    folder = tmp_path / "user"
    folder.mkdir()
    if command in GIVEN:
        GIVEN[command](folder)
    done = run_command(command, folder)
    assert done.returncode == EXIT.get(command, 0), (
        f"{command!r} exited {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    for line in dict(blocks(README.read_text())).get(command, []):
        assert line in done.stdout + done.stderr, f"{command!r} does not print {line!r}"
    if command in SHOWS:
        SHOWS[command](folder, done.stdout)


@pytest.mark.slow
def test_readme_quick_start(builtin_replay_run: OptimizeRun) -> None:
    """The README's main job, run from a shell once per test run (conftest), exits 0,
    prints what the README shows and leaves a judged result folder."""
    run = builtin_replay_run
    assert run.exit_code == 0, run.output[-3000:]
    for line in dict(blocks(README.read_text()))[README_OPTIMIZE]:
        assert line in run.output, f"{README_OPTIMIZE!r} does not print {line!r}"
    assert run.out.name.startswith("gelu_bias_scale-"), run.out
    assert (run.out / "report.md").is_file() and (run.out / "result" / "model_new.py").is_file()
    assert json.loads((run.out / "judge.json").read_text())["reward"] >= 1
    assert "result folder:" in run.output


def test_skipped_and_tuned_commands_are_documented() -> None:
    """Every entry of the tables names a command the README or docs/ still hold."""
    documented = set(_readme_commands()) | set(_doc_commands())
    for name, table in {"SKIP": SKIP, "QUICK": QUICK, "SLOW": SLOW, "GIVEN": GIVEN,
                        "SHOWS": SHOWS, "EXIT": EXIT}.items():
        stale = [c for c in table if c not in documented]
        assert not stale, f"{name} names commands no longer documented: {stale}"
    assert len(_doc_commands()) > 40  # docs/ read, not an empty glob


def test_commands_are_extracted_as_written() -> None:
    """Continuations, comments and `&&` are read as a shell reads them."""
    text = "```bash\ncuda-agent a --x 1 \\\n    --y '#2'  # note\n# c\nb && c\n```\n```\nno\n```\n"
    assert commands(text) == ["cuda-agent a --x 1 --y '#2'", "b", "c"]
    console = "```console\nbanner\n$ cuda-agent tasks list x\nrow 1\n\n$ b\n```\n"
    assert blocks(console) == [("cuda-agent tasks list x", ["row 1"]), ("b", [])]


def test_help_lists_every_command_of_the_table(tmp_path: Path) -> None:
    """`cuda-agent --help`, as the README's Commands section types it, names every command of
    its table."""
    folder = tmp_path / "user"
    folder.mkdir()
    done = run_command("cuda-agent --help", folder)
    assert done.returncode == 0, done.stderr
    table = re.findall(r"^\| `cuda-agent (\w+)", README.read_text(), re.M)
    assert len(table) > 10
    listed = set(re.findall(r"^│ (\w+) ", done.stdout, re.M))
    assert set(table) <= listed, f"not in --help: {set(table) - listed}"
