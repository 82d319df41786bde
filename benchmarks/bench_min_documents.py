"""The number of documents below which each claim's bootstrap cannot resolve its verdict, from simulated studies.

A simulated study (``tests.fixtures.simulate_study``) gives every head known
true means and scatters each document's values around them; the package
accumulates them with Poisson-bootstrap weights as a real run does, and
`tl_geometry.claims` computes each claim's value and interval. The true
value of each claim is its statistic on the true means
(``tests.test_claim_coverage.true_values``).

The population here (``POPULATION_SEED``) is one the tests and the docs do
not report on. For each number of documents of ``LADDER``, ``STUDIES``
studies: per claim, the share whose interval covers the true value. A claim
is resolved from the smallest document count of the ladder from which on
(that count and every larger one) its interval covers in at least
``COVERAGE_FLOOR`` of the studies (a nominal 95 % interval that covers less
than 90 % says less than it claims); below it the verdict is "too few
documents". The rule and the floor were fixed before the run.

    PYTHONPATH=. python benchmarks/bench_min_documents.py
"""

import math
import sys
import time

import jaxtyping
import numpy as np

from tests.fixtures import simulate_study, true_means
from tests.test_claim_coverage import COVERED, estimate, true_values
from tl_geometry import claims

POPULATION_SEED = 11  # held out: the tests use population 0
LADDER = (2, 4, 8, 16, 32)
# Measured after the ladder, with the same stream of draws (the ladder's cells unchanged), printed, not used by the
# rule: what a claim declared "more than 32" (kept as 64) meets at 64.
BEYOND = (64,)
STUDIES = 30
COVERAGE_FLOOR = 0.90


def main(studies: int = STUDIES) -> dict[str, int]:
    jaxtyping.config.update("jaxtyping_disable", True)
    means = true_means(POPULATION_SEED)
    rng = np.random.default_rng(POPULATION_SEED + 1000)
    coverage: dict[int, dict[str, float]] = {}
    outside: dict[int, dict[str, int]] = {}
    for documents in (*LADDER, *BEYOND):
        start = time.perf_counter()
        truth = true_values(means, documents)  # the role claims' truth: the rules at this count's standard errors
        hits = {key: [0, 0] for key in COVERED}
        off = dict.fromkeys(COVERED, 0)
        for _ in range(studies):
            table = claims(simulate_study(means, rng, documents))
            for key in COVERED:
                value, low, high = estimate(table, key)
                if not math.isnan(low):
                    hits[key][0] += low <= truth[key] <= high
                    hits[key][1] += 1
                    off[key] += not (low <= value <= high)
        coverage[documents] = {key: c / max(1, n) for key, (c, n) in hits.items()}
        outside[documents] = off
        print(f"{documents} documents: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    needed = {}
    for key in COVERED:
        ok = [coverage[d][key] >= COVERAGE_FLOOR for d in LADDER]
        first = next((i for i in range(len(LADDER)) if all(ok[i:])), None)
        needed[key] = LADDER[first] if first is not None else 2 * LADDER[-1]
    print(f"population {POPULATION_SEED}, {studies} studies per count; coverage of the claim's own interval "
          f"(point estimate outside its interval, studies); needed: the smallest count from which on coverage >= "
          f"{COVERAGE_FLOOR}")
    counts = (*LADDER, *BEYOND)
    print("| claim | " + " | ".join(f"{d} docs" for d in counts) + " | needed (from the ladder) |")
    print("|---|" + "---|" * len(counts) + "---|")
    for key in COVERED:
        cells = " | ".join(f"{coverage[d][key]:.2f} ({outside[d][key]})" for d in counts)
        print(f"| {key} | {cells} | {needed[key]} |")
    return needed


if __name__ == "__main__":
    print(main(int(sys.argv[1]) if len(sys.argv) > 1 else STUDIES))
