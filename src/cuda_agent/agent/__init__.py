"""The agent: a ReAct loop over a workspace, its tools, policies and trajectories."""
