"""Analysis: replay, sweep and plan over traces, fidelity against real runs, reports, plots and tables."""
