"""Engine: pure tensor maths of top-N selection (the selection context, ordering, metrics, chunking)."""
