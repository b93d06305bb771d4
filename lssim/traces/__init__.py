"""Traces in: the trace format and its checks, summaries, synthesis, importers of the frameworks' dumps, and the
Workload that answers what a response would be."""
