"""The loop and its records: the controller that runs RL steps, the policy hooks, the execution modes, and the
objects and books they pass between them. Shared by the simulator and the real backend."""
