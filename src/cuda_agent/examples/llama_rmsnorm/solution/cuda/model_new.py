import cuda_extension
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    """LlamaRMSNorm in one fused pass per row by the rms_norm kernel; the same parameter
    (``weight``) as LlamaRMSNorm, so its state_dict loads strictly."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return cuda_extension.rms_norm(hidden_states.contiguous(), self.weight,
                                       self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"
