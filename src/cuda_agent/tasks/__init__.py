"""Tasks in KernelBench format: the typed ``Task`` and loaders for files and data sets."""

from cuda_agent.tasks.loaders import load_task, load_tasks
from cuda_agent.tasks.task import Precision, Task, TaskError

__all__ = ["Precision", "Task", "TaskError", "load_task", "load_tasks"]
