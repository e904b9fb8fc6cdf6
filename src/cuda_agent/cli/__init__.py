"""The ``cuda-agent`` command line: one sub-command per pipeline stage."""
