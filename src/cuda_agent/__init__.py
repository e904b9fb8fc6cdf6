"""cuda-agent: agents that turn PyTorch programs into faster, verified custom kernels.

Pipeline stages live in sub-packages: ``tasks`` (task format and loaders), ``workspace``
(the agent's workspace), ``build`` (incremental kernel builds), ``judge`` (verification,
timing and reward). ``cuda-agent --help`` lists the command for each stage.
"""

__version__ = "0.1.0"
