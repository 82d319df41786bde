"""Results: mergeable accumulators, GeometryResult, and its files (one atomic unit)."""
