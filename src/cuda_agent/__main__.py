"""``python -m cuda_agent`` is the ``cuda-agent`` command."""

from cuda_agent.cli.main import main

main()
