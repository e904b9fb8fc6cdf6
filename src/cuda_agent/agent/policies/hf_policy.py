"""A policy on a local Hugging Face causal LM (a folder with the model and its tokenizer).

    cuda-agent ... --model hf:/models/my-checkpoint

Each step renders the conversation (``hf_template.render_prompt``), samples the answer
(greedy at temperature 0), reads tool calls written as ``<tool_call>{...}</tool_call>``
blocks (``calls.parse_tool_calls``) and returns a TokenView for training: the prompt's ids,
the generated ids, each generated token's log-probability under the model, and a loss mask
of ones over the response.

The log-probabilities are those of the unmodified model (log-softmax of its raw logits, as
at temperature 1), whatever the sampling temperature: that is the quantity an RL trainer
compares its own forward pass against.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cuda_agent.agent.policies.calls import parse_tool_calls
from cuda_agent.agent.policies.hf_template import PLAIN_END, render_prompt
from cuda_agent.agent.types import (
    Message,
    PolicyError,
    PolicyStep,
    TokenView,
    ToolSpec,
    Usage,
)
from cuda_agent.precision import compute_precision

Dtype = Literal["auto", "float32", "float16", "bfloat16"]


class HFConfig(BaseModel):
    """Where the local model is and how to sample from it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(min_length=1)
    """A folder that ``AutoModelForCausalLM`` and ``AutoTokenizer`` both load."""
    device: str = "auto"
    """'auto' (CUDA when available, else CPU), 'cpu', 'cuda', 'cuda:1', ..."""
    dtype: Dtype = "auto"
    """'auto': bfloat16 on CUDA, float32 on CPU."""
    max_new_tokens: int = Field(default=1024, gt=0)
    """Limit on the tokens of one answer."""
    temperature: float = Field(default=1.0, ge=0)
    """0: greedy decoding; otherwise plain sampling (no top-k / top-p)."""


class HFPolicy:
    """A transformers causal LM as a Policy, with a token view of every step."""

    def __init__(self, config: HFConfig) -> None:
        try:
            import torch
            import transformers
        except ImportError as exc:  # pragma: no cover - both are dependencies
            raise PolicyError("the hf policy needs 'torch' and 'transformers'") from exc
        folder = Path(config.path)
        if not folder.is_dir():
            raise PolicyError(f"hf policy: model folder not found: {folder}")
        self.config = config
        self.name = f"hf:{config.path}"
        self._torch = torch
        self.device = _pick_device(torch, config.device)
        dtype = _pick_dtype(torch, config.dtype, self.device)
        try:
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
            self.model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
        except (OSError, ValueError) as exc:
            raise PolicyError(f"hf policy: cannot load a causal LM and tokenizer from "
                              f"{folder}: {exc}") from exc
        self.model.to(self.device).eval()
        self._steps = 0

    def render(self, messages: list[Message], tools: list[ToolSpec]) -> str:
        """The prompt text this policy feeds the model."""
        return render_prompt(self.tokenizer, messages, tools)

    def step(self, messages: list[Message], tools: list[ToolSpec]) -> PolicyStep:
        start = time.monotonic()
        prompt = self.render(messages, tools)
        prompt_ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        if not prompt_ids:
            raise PolicyError(f"{self.name}: the rendered prompt is empty")
        response_ids, logprobs = self._generate(prompt_ids)
        text = self.tokenizer.decode(response_ids, skip_special_tokens=True)
        if not getattr(self.tokenizer, "eos_token", None):
            text = text.split(PLAIN_END, 1)[0]
        content, calls = parse_tool_calls(text, id_prefix=f"call-{self._steps}")
        self._steps += 1
        tokens = TokenView(prompt_ids=tuple(prompt_ids), response_ids=tuple(response_ids),
                           logprobs=tuple(logprobs), loss_mask=(1,) * len(response_ids))
        return PolicyStep(message=Message(role="assistant", content=content, tool_calls=calls),
                          usage=Usage(prompt_tokens=len(prompt_ids),
                                      completion_tokens=len(response_ids)),
                          tokens=tokens, seconds=time.monotonic() - start)

    def _generate(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
        """Sample one answer; returns its ids and their log-probabilities."""
        torch = self._torch
        input_ids = torch.tensor([prompt_ids], device=self.device)  # [1, P]
        options: dict[str, Any] = {"max_new_tokens": self.config.max_new_tokens,
                                   "return_dict_in_generate": True, "output_logits": True}
        if self.config.temperature > 0:
            options.update(do_sample=True, temperature=self.config.temperature, top_k=0,
                           top_p=1.0)
        else:
            options.update(do_sample=False)
        stops = self._stop_ids()
        if stops:
            options["eos_token_id"] = stops
        if getattr(self.tokenizer, "eos_token_id", None) is None:
            options.update(stop_strings=[PLAIN_END], tokenizer=self.tokenizer)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (
            stops[0] if stops else None)
        with torch.no_grad(), compute_precision(self.model):
            out = self.model.generate(input_ids=input_ids,
                                      attention_mask=torch.ones_like(input_ids),
                                      pad_token_id=pad if pad is not None else 0, **options)
        response = out.sequences[0, len(prompt_ids):]  # [T]
        if out.logits:
            logits = torch.stack(out.logits, dim=1)[0, : response.shape[0]]  # [T, V]
        else:  # pragma: no cover - generation without logits: one forward pass instead
            with torch.no_grad(), compute_precision(self.model):
                logits = self.model(out.sequences).logits[0, len(prompt_ids) - 1: -1]
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        chosen = logprobs.gather(-1, response.unsqueeze(-1)).squeeze(-1)  # [T]
        return response.tolist(), chosen.tolist()


    def _stop_ids(self) -> list[int]:
        """Ids that end an answer: the model's generation config's and the tokenizer's EOS
        (the plain template closes turns with the tokenizer's EOS)."""
        ids: list[int] = []
        config = getattr(self.model, "generation_config", None)
        configured = getattr(config, "eos_token_id", None)
        head = self.model.get_output_embeddings()
        vocab = head.weight.shape[0] if head is not None else 1 << 62
        for value in ([configured] if isinstance(configured, int) else configured or []):
            ids.append(int(value))
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        return [i for i in dict.fromkeys(ids) if 0 <= i < vocab]


def _pick_device(torch: Any, device: str) -> Any:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as exc:
        raise PolicyError(f"hf policy: bad device {device!r}: {exc}") from exc


def _pick_dtype(torch: Any, dtype: str, device: Any) -> Any:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)
