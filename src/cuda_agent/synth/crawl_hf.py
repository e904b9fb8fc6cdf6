"""Transformers building blocks as seed operators, built from small configs (no hub access).

Activations (``ACT2FN``), norms, MLPs, attention (with its rotary embedding), decoder layers
and MoE blocks of common architectures, plus rotary embeddings applied to a tensor. Weights
are random. Without ``transformers`` installed the crawler says so and skips these.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from cuda_agent.synth.catalog import InputSpec
from cuda_agent.synth.probe_op import Attempt

ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "granite", "olmo",
         "cohere", "starcoder2", "stablelm", "mixtral", "gpt2", "bert", "t5", "gpt_neox")
CONFIG_ARGS = {"hidden_size": "{hidden_size}", "n_embd": "{hidden_size}",
               "intermediate_size": "{intermediate_size}", "n_inner": "{intermediate_size}",
               "num_attention_heads": "4", "n_head": "4", "num_key_value_heads": "2",
               "head_dim": "{hidden_size} // 4", "num_local_experts": "4",
               "num_experts_per_tok": "2", "attention_dropout": "0.0", "hidden_dropout": "0.0",
               "resid_pdrop": "0.0", "attn_pdrop": "0.0", "embd_pdrop": "0.0",
               "hidden_dropout_prob": "0.0", "attention_probs_dropout_prob": "0.0",
               "dropout_rate": "0.0"}
HIDDEN = {"hidden_size": "$-1"}
SIZES = {"hidden_size": "$-1", "intermediate_size": 128}
X3 = (InputSpec(shape=()),)
ROPE_CALL = ("{mod}({x}, position_embeddings={mod_rope}({x}, torch.arange({x}.shape[1], "
             "device={x}.device)[None]), attention_mask=None)")
MISSING = ("transformers is not installed: transformers blocks are skipped "
           "(pip install transformers)")


def available() -> bool:
    return importlib.util.find_spec("transformers") is not None


def candidates() -> dict[str, Callable[[], list[Attempt]]]:
    """Names of the transformers candidates and a factory of attempts for each."""
    if not available():
        return {}
    found: dict[str, Callable[[], list[Attempt]]] = {}
    for key in _activation_names():
        found[f"transformers.act.{key}"] = lambda k=key: [Attempt(
            op=f"transformers.act.{k}", kind="module", source="transformers",
            imports=("from transformers.activations import ACT2FN",),
            init_code=f'ACT2FN["{k}"]', call_code="{mod}({x})", inputs=X3)]
    for arch in ARCHS:
        for cls in _classes(arch):
            found[f"transformers.{cls}"] = lambda a=arch, c=cls: _block_attempts(a, c)
    return found


def _activation_names() -> list[str]:
    from transformers.activations import ACT2CLS

    return sorted(ACT2CLS)


def _module(arch: str):
    return importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")


def _classes(arch: str) -> list[str]:
    suffixes = ("RMSNorm", "LayerNorm", "MLP", "Attention", "RotaryEmbedding", "DecoderLayer",
                "SparseMoeBlock", "Intermediate", "SelfAttention")
    try:
        module = _module(arch)
    except Exception:
        return []
    prefix = _config_name(arch).removesuffix("Config")
    return sorted(n for n in dir(module) if n.startswith(prefix[:3]) and n.endswith(suffixes)
                  and "Cross" not in n and "Flash" not in n and "Sdpa" not in n)


def _config_name(arch: str) -> str:
    conf = importlib.import_module(f"transformers.models.{arch}.configuration_{arch}")
    return next(n for n in dir(conf) if n.endswith("Config") and n != "PretrainedConfig"
                and not n.startswith("Pre"))


def _config_args(config: str) -> str:
    import inspect

    import transformers

    cls = getattr(transformers, config)
    known = set(inspect.signature(cls.__init__).parameters) | set(
        getattr(cls, "attribute_map", {}))
    for klass in cls.__mro__:
        known |= set(getattr(klass, "__annotations__", {}))
    args = {k: v for k, v in CONFIG_ARGS.items() if k in known}
    direct = set(inspect.signature(cls.__init__).parameters)
    for long, short in (("hidden_size", "n_embd"), ("num_attention_heads", "n_head"),
                        ("intermediate_size", "n_inner")):
        if long in args and short in args:
            del args[long if short in direct else short]
    return ", ".join(f"{k}={v}" for k, v in args.items())


def _block_attempts(arch: str, cls: str) -> list[Attempt]:
    config = _config_name(arch)
    module = f"transformers.models.{arch}.modeling_{arch}"
    rope = next((n for n in dir(_module(arch)) if n.endswith("RotaryEmbedding")), None)
    imports = (f"from transformers import {config}",
               f"from {module} import {cls}" + (f", {rope}" if rope and rope != cls else ""))
    cfg = f"{config}({_config_args(config)})"
    common = {"op": f"transformers.{cls}", "kind": "module", "source": "transformers",
              "imports": imports, "ranks": (3,), "inputs": X3}
    if cls.endswith("RotaryEmbedding"):
        rope_imports = (*imports, f"from {module} import apply_rotary_pos_emb")
        return [Attempt(**{**common, "imports": rope_imports, "ranks": (4,)},
                        init_code=f"{cls}({config}(hidden_size={{head_dim}}, "
                                  "num_attention_heads=1, head_dim={head_dim}))",
                        params={"head_dim": "$-1"},
                        call_code="apply_rotary_pos_emb({x}, {x}, *{mod}({x}, torch.arange("
                                  "{x}.shape[2], device={x}.device)[None]))[0]")]
    if cls.endswith(("RMSNorm", "LayerNorm")):
        return [Attempt(**common, init_code=f"{cls}({{hidden_size}})", params=HIDDEN,
                        call_code="{mod}({x})")]
    attempts = []
    for init in (f"{cls}({cfg})", f"{cls}({cfg}, layer_idx=0)",
                 f"{cls}({{intermediate_size}}, {cfg})"):
        attempts.append(Attempt(**common, init_code=init, params=SIZES, call_code="{mod}({x})"))
        if rope and cls.endswith(("Attention", "DecoderLayer")):
            attempts.insert(-1, Attempt(**common, init_code=init, params=SIZES,
                                        extra_init={"rope": f"{rope}({cfg})"},
                                        call_code=ROPE_CALL))
    return attempts
