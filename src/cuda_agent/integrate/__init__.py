"""From a user's model to a faster model: extract a sub-module as a task, put the optimized
module back, check and export the result.

Extract (``cuda_agent.integrate.extract``)::

    cuda-agent extract mypkg.model:build_model --child 'layers.0.mlp' --inputs 'long[2,16]:0..1000'

Put back, check and ship (``replace``, ``check``, ``export``)::

    report = replace(model, "layers.*.mlp", "runs/mlp")      # an optimize OUT folder
    result = check_model(model, "layers.*.mlp", "runs/mlp", (tokens,))
    cuda-agent export runs/mlp --name fast_mlp --out dist/fast_mlp
"""

from cuda_agent.integrate.check import CheckConfig, CheckResult, check, check_model
from cuda_agent.integrate.extract import ExtractResult, build, extract, extract_module
from cuda_agent.integrate.load import IntegrateError
from cuda_agent.integrate.replace import ReplaceReport, replace
from cuda_agent.integrate.specs import ExtractError

__all__ = ["CheckConfig", "CheckResult", "ExtractError", "ExtractResult", "IntegrateError",
           "ReplaceReport", "build", "check", "check_model", "extract",
           "extract_module", "replace"]
