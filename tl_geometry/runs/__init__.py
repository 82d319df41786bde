"""Runs: `analyze_corpus` over a corpus (streamed, checkpointed, data parallel), and the device check."""
