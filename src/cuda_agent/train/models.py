"""The actor (a causal LM) and the critic (the same backbone + a scalar value head).

    actor, tokenizer = load_actor(config.model)
    critic = load_critic(config.model)
    logprobs = token_logprobs(actor, input_ids, attention_mask)   # [B, T]

Dropout is switched off in both (RL compares log-probabilities of two forward passes, which
must agree when the weights do). LoRA adapters (peft) are added when ``model.lora`` is set;
otherwise all weights train. Weights that train are kept in fp32 (``model.master_weights``):
with ``dtype: bf16`` a fully trained model is loaded in fp32 and its forward passes run under
bf16 autocast (``cuda_agent.precision``); LoRA adapters are fp32 over a bf16 base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from cuda_agent.precision import compute_dtype, compute_precision, mark_compute_dtype
from cuda_agent.train.config import ModelConfig

VALUE_HEAD = "value_head.pt"


class ModelLoadError(RuntimeError):
    """The model folder cannot be loaded."""


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if name == "bf16" else torch.float32


def weight_dtype(config: ModelConfig, device: torch.device) -> torch.dtype:
    """The dtype the weights are loaded in: fp32 when all of them train in a lower compute
    precision with master weights, else the compute dtype (a LoRA base is frozen)."""
    compute = pick_dtype(config.dtype, device)
    if compute != torch.float32 and config.master_weights and config.lora is None:
        return torch.float32
    return compute


def _mark(model: Any, config: ModelConfig, device: torch.device) -> None:
    compute = pick_dtype(config.dtype, device)
    if weight_dtype(config, device) != compute:
        mark_compute_dtype(model, compute)


def load_tokenizer(path: str) -> Any:
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load a tokenizer from {path}: {exc}") from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_actor(config: ModelConfig, path: str | None = None) -> tuple[nn.Module, Any]:
    """(model on its device, tokenizer); ``path`` overrides ``config.path``."""
    import transformers

    folder = path or config.path
    _check_folder(folder)
    device = pick_device(config.device)
    try:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=weight_dtype(config, device))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load a causal LM from {folder}: {exc}") from None
    model = _prepare(model, config, device)
    _mark(model, config, device)
    return model, load_tokenizer(folder)


class ValueModel(nn.Module):
    """A backbone's last hidden state -> Linear(hidden, 1): one value per token."""

    def __init__(self, backbone: nn.Module, hidden: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        with compute_precision(self):
            out = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                                use_cache=False)  # the last layer only; no KV cache
        hidden = out.last_hidden_state  # [B, T, H]
        return self.value_head(hidden.to(self.value_head.weight.dtype)).squeeze(-1)  # [B, T]

    def save(self, folder: Path) -> None:
        """The backbone (or its adapter) by save_pretrained, the head as a state dict."""
        folder.mkdir(parents=True, exist_ok=True)
        self.backbone.save_pretrained(folder)
        torch.save(self.value_head.state_dict(), folder / VALUE_HEAD)


def load_critic(config: ModelConfig) -> ValueModel:
    """The critic: ``critic_path`` (a saved ValueModel) or a fresh head on ``path``."""
    import transformers

    folder = config.critic_path or config.path
    _check_folder(folder)
    device = pick_device(config.device)
    dtype = weight_dtype(config, device)
    adapter = Path(folder) / "adapter_config.json"
    try:
        if adapter.is_file():  # a LoRA critic: base model + adapter
            from peft import PeftModel

            base = transformers.AutoModel.from_pretrained(config.path, dtype=dtype)
            backbone: Any = PeftModel.from_pretrained(base, folder, is_trainable=True)
        else:
            backbone = transformers.AutoModel.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load a critic backbone from {folder}: {exc}") from None
    if not adapter.is_file():
        backbone = _prepare(backbone, config, device, task_type="FEATURE_EXTRACTION")
    critic = ValueModel(backbone, _hidden_size(backbone))
    head = Path(folder) / VALUE_HEAD
    if head.is_file():
        critic.value_head.load_state_dict(torch.load(head, map_location="cpu"))
    _no_dropout(critic)
    _mark(critic, config, device)
    return critic.to(device)


def _prepare(model: Any, config: ModelConfig, device: torch.device,
             task_type: str = "CAUSAL_LM") -> Any:
    _no_dropout(model)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if hasattr(model, "config"):
            model.config.use_cache = False
    if config.lora is not None:
        from peft import LoraConfig, get_peft_model

        if config.gradient_checkpointing:
            model.enable_input_require_grads()
        lora = LoraConfig(r=config.lora.r, lora_alpha=config.lora.alpha,
                          lora_dropout=config.lora.dropout,
                          target_modules=config.lora.target_modules, task_type=task_type)
        model = get_peft_model(model, lora)
    return model.to(device)


def _no_dropout(model: nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def _hidden_size(model: Any) -> int:
    config = model.config
    for name in ("hidden_size", "n_embd", "d_model"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    raise ModelLoadError("cannot tell the backbone's hidden size from its config")


def _check_folder(folder: str) -> None:
    if not Path(folder).is_dir():
        raise ModelLoadError(f"model folder not found: {folder}")


def token_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """Log-probability of each token given the ones before it -> [B, T].

    Position t scores token t (from the logits at t-1); position 0 has no context and is 0.
    """
    with compute_precision(model):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [B, T, V]
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)  # [B, T-1, V]
    chosen = logprobs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)  # [B, T-1]
    return torch.nn.functional.pad(chosen, (1, 0))


def trainable_state(model: nn.Module) -> dict[str, Tensor]:
    """The weights that train (all, or the adapters and the value head), on the CPU."""
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k in names}


def load_trainable_state(model: nn.Module, state: dict[str, Tensor]) -> None:
    missing = set(state) - set(model.state_dict())
    if missing:
        raise ModelLoadError(f"checkpoint weights do not fit the model: {sorted(missing)[:5]}")
    model.load_state_dict(state, strict=False)


def save_actor(model: Any, tokenizer: Any, folder: Path) -> None:
    """The actor for the next stage: a plain model folder with the tokenizer, in the dtype
    it computes in (LoRA adapters are merged into the weights and fp32 master weights are
    cast, so call this once, at the end)."""
    folder.mkdir(parents=True, exist_ok=True)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    if compute_dtype(model) is not None:
        model = model.to(compute_dtype(model))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
