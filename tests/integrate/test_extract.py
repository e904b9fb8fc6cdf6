"""Extract sub-modules of a tiny random Llama (and small custom modules) as tasks."""

from __future__ import annotations

import enum
import math
from http import HTTPStatus
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cuda_agent.cli.main import app
from cuda_agent.integrate.capture import find_children, group_name
from cuda_agent.integrate.extract import ExtractError, build, extract
from cuda_agent.integrate.literals import NotSource, Renderer
from cuda_agent.integrate.profile import rank
from cuda_agent.integrate.specs import SpecError, parse_spec, to_sample
from cuda_agent.tasks import load_task
from cuda_agent.tasks.shapes import input_shapes, with_shape

MODELS = "tests.integrate.extract_models"
LLAMA = f"{MODELS}:tiny_llama"
TOKENS = "long[2,16]:0..100"


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run faster on one thread (and do not fight the other test workers)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _namespace(code: str) -> dict:
    namespace: dict = {"__name__": "task"}
    exec(compile(code, "model.py", "exec"), namespace)
    return namespace


def test_rmsnorm_wildcard_several_shapes(tmp_path: Path):
    result = extract(LLAMA, [TOKENS, "long[1,40]:0..100"], child="model.layers.*.input_layernorm",
                     out=tmp_path)
    assert result.ok, result.checks
    assert result.matched == ("model.layers.0.input_layernorm", "model.layers.1.input_layernorm")
    assert [c.exact for c in result.checks] == [True, True]
    code = (tmp_path / "model.py").read_text()
    assert "class Model(LlamaRMSNorm):" in code and "2 modules match" in code
    shapes = input_shapes(code)
    assert shapes == result.input_shapes and list(shapes) == ["s0", "s1"]
    for name, want in zip(shapes, [(2, 16, 32), (1, 40, 32)], strict=True):
        (x,) = _namespace(with_shape(code, name))["get_inputs"]()
        assert tuple(x.shape) == want and x.dtype == torch.float32
    assert {k for k in _namespace(code) if k.isupper()} >= set(shapes["s0"])


def test_mlp_with_config_reproduces_user_weights(tmp_path: Path):
    result = extract(LLAMA, [TOKENS], child="model.layers.0.mlp", out=tmp_path)
    assert result.ok and result.input_shapes == {} and not result.fallback
    code = load_task(tmp_path / "model.py").code
    assert "LlamaConfig(**{" in code and "class Model(LlamaMLP):" in code
    namespace = _namespace(code)
    model = namespace["Model"](*namespace["get_init_inputs"]())
    model.load_state_dict(torch.load(tmp_path / "weights.pt"), strict=True)
    user = find_children(build(LLAMA), "model.layers.0.mlp")[0][1]
    x = namespace["get_inputs"]()[0]
    assert torch.equal(model(x), user(x))
    assert (tmp_path / "extract.json").read_text().count('"exact": true') == 1


def test_constants_tuple_and_keyword_tensors(tmp_path: Path):
    result = extract(f"{MODELS}:Gate", [f"{MODELS}:gate_sample"], init_args=[8], out=tmp_path)
    assert result.ok, result.checks
    code = (tmp_path / "model.py").read_text()
    assert "from torch.nn.modules.activation import GELU" in code
    assert "INIT_KWARGS = {'bias': True}" in code
    assert "def forward(self, x, pair_0, pair_1, mask):" in code
    assert "super().forward(x=x, pair=(pair_0, pair_1), scale=0.5, mask=mask)" in code
    assert "torch.randint(0, 2, (MASK_0, MASK_1), dtype=torch.int64)" in code


def test_fallback_saves_the_module(tmp_path: Path):
    result = extract(f"{MODELS}:scaled", ["float32[3,4]"], child="0", out=tmp_path)
    assert result.ok and "torch.Tensor" in result.fallback
    assert (tmp_path / "module.pt").is_file()
    assert "MODULE_FILE" in (tmp_path / "model.py").read_text()


@pytest.mark.parametrize(("spec", "message"), [
    ("float32[2,x]", "dimensions must be non-negative integers"),
    ("floaty[2]", "unknown dtype 'floaty'"),
    ("long[2]:5..1", "empty range"),
    ("long[2]:0..1.5", "integer bounds"),
    ("nonsense", "expected tensor specs"),
    ("float32(2)", "expected tensor specs"),
    ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz'"),
    (f"{MODELS}:nothing_here", "has no attribute 'nothing_here'"),
])
def test_bad_specs(spec: str, message: str):
    with pytest.raises(SpecError, match=message):
        parse_spec(spec)


def test_spec_grammar():
    sample = parse_spec("long[2,16]:0..1000; float32[2,16,8], bool[3]", seed=1)
    ids, x, flags = sample.args
    assert ids.dtype == torch.int64 and int(ids.min()) >= 0 and int(ids.max()) < 1000
    assert x.shape == (2, 16, 8) and flags.dtype == torch.bool
    assert torch.equal(parse_spec("long[4]:0..9", 3).args[0], parse_spec("long[4]:0..9", 3).args[0])
    assert to_sample({"x": torch.ones(1)}).kwargs.keys() == {"x"}


def test_bad_targets(tmp_path: Path):
    with pytest.raises(ExtractError, match="no sub-module matches 'model.layer.0.mlp'.*"
                                           "model.layers.0.mlp"):
        extract(LLAMA, [TOKENS], child="model.layer.0.mlp", out=tmp_path)
    with pytest.raises(ExtractError, match="no sample inputs"):
        extract(LLAMA, [], out=tmp_path)
    with pytest.raises(ExtractError, match="not an nn.Module"):
        extract(f"{MODELS}:gate_sample", [TOKENS], out=tmp_path)
    with pytest.raises(ExtractError, match="sample forward .* raised"):
        extract(LLAMA, ["float32[2,3]"], out=tmp_path)


def test_literals():
    class Local(enum.Enum):
        RED = 1

    r = Renderer()
    assert r.literal({"a": (1,), "b": {2}, "c": torch.bfloat16}) == (
        "{'a': (1,), 'b': {2}, 'c': torch.bfloat16}")
    assert eval(r.literal(math.inf)) == math.inf
    with pytest.raises(NotSource, match="x\\[0\\]: a torch.Tensor"):
        r.literal([torch.ones(1)], "x")
    assert r.literal(HTTPStatus.OK) == "HTTPStatus.OK"
    assert "from http import HTTPStatus" in r.imports
    with pytest.raises(NotSource, match="not importable"):
        r.literal(Local.RED)
    assert group_name("model.layers.12.mlp") == "model.layers.*.mlp"


def test_rank_shares():
    model = build(LLAMA)
    samples = [to_sample(TOKENS)]
    flat = rank(model, samples, repeats=1, group=False)
    assert math.isclose(sum(m.self_share for m in flat.modules), 1.0, rel_tol=1e-6)
    assert flat.modules[0].name == "(model)" and flat.modules[0].inclusive_share == 1.0
    grouped = {m.name: m for m in rank(model, samples, repeats=1, top=6).modules}
    assert len(grouped) == 6 and grouped["model.layers.*"].count == 2
    assert 0 < grouped["model.layers.*"].inclusive_share <= 1


def test_cli(tmp_path: Path):
    runner = CliRunner()
    out = tmp_path / "mlp"
    ok = runner.invoke(app, ["extract", LLAMA, "-i", TOKENS, "-c", "model.layers.1.mlp",
                             "-o", str(out), "--rank", "--top", "3", "--repeats", "1"])
    assert ok.exit_code == 0, ok.output
    assert "forward time by module" in ok.output and "reproduces the module" in ok.output
    assert {p.name for p in out.iterdir()} == {"model.py", "weights.pt", "extract.json"}
    bad = runner.invoke(app, ["extract", LLAMA, "-i", "long[2,16]:0..", "-o", str(out)])
    assert bad.exit_code == 2 and "not a tensor spec" in bad.output
    again = runner.invoke(app, ["extract", LLAMA, "-i", TOKENS, "-c", "model.layers.1.mlp",
                                "-o", str(out)])
    assert again.exit_code == 2, again.output
    assert "exists and is not empty (use --force to replace it)" in again.output
    (out / "notes.txt").write_text("the user's")
    replaced = runner.invoke(app, ["extract", LLAMA, "-i", TOKENS, "-c", "model.layers.1.mlp",
                                   "-o", str(out), "--force"])
    assert replaced.exit_code == 0, replaced.output
    assert {p.name for p in out.iterdir()} == {"model.py", "weights.pt", "extract.json"}
    with pytest.raises(ExtractError, match="not empty"):
        extract(LLAMA, [TOKENS], child="model.layers.1.mlp", out=out)
