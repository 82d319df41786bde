"""Analysis from a result only: taxonomy rules, the sink correlation, summaries."""
