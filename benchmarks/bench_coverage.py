"""Coverage of each claim's interval in sample (where its method was chosen) and out of sample.

Simulated studies (``tests/test_claim_coverage.py`` says how: every head has
known true means, each document scatters around them with skewed noise, the
package accumulates them with Poisson-bootstrap weights and `claims`
computes every interval) on:

- the tuning set: population ``TUNING`` at ``TUNING_DOCUMENTS`` documents,
  every interval method at the plain and the expanded level. Each claim's
  method and level (``claims.INTERVAL_METHOD``, ``claims.NOT_EXPANDED``) are
  chosen from this table only;
- the held-out populations (``HELD_OUT``: other seeds and other generating
  parameters) at 8, 16 and 32 documents, with the claims' own intervals.
  The acceptance is this table: every claim within 90-98 % at 16 and 32
  documents, stated at 8.

Coverage is the share of the studies whose interval covers the true value;
with ``STUDIES`` studies per cell its binomial standard error at 0.95 is
about 0.015 (200 studies). The last column gives each claim's held-out range
at 16 and 32 documents, and at 8.

    PYTHONPATH=. python benchmarks/bench_coverage.py [studies] [--tuning-only | --held-out-only]
"""

import sys
import time

import torch

from tests.test_claim_coverage import (
    COVERED,
    HELD_OUT,
    TUNING,
    TUNING_DOCUMENTS,
    chosen,
    coverage,
    every_choice,
    share,
)

STUDIES = 200
COUNTS = (8, 16, 32)


def tuning_table(studies: int) -> None:
    start = time.perf_counter()
    found = coverage(TUNING, TUNING_DOCUMENTS, studies, every_choice())
    print(f"tuning: population seed {TUNING.seed}, {TUNING_DOCUMENTS} documents, {studies} studies "
          f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    names = list(found)
    own = chosen()
    print(f"\nTuning set (population seed {TUNING.seed}, {TUNING_DOCUMENTS} documents, {studies} studies): coverage "
          "of nominal 95 % intervals")
    print(f"| claim | {' | '.join(names)} | chosen |\n|---|{'---|' * len(names)}---|")
    for key in COVERED:
        method, expand = own[key]
        cells = " | ".join(f"{share(found[name][key]):.3f}" if found[name][key][1] else "-" for name in names)
        print(f"| {key} | {cells} | {method}, {'expanded' if expand else 'plain'} |")


def held_out_table(studies: int) -> dict[str, dict[int, list[float]]]:
    cells: dict[tuple[str, int], dict] = {}
    for name, population in HELD_OUT.items():
        for documents in COUNTS:
            start = time.perf_counter()
            cells[name, documents] = coverage(population, documents, studies)["chosen"]
            print(f"held out {name}, {documents} documents: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    columns = list(cells)
    print(f"\nHeld out ({studies} studies per cell): coverage of each claim's own nominal 95 % interval (in brackets: "
          "studies whose estimate lay outside its own interval)")
    print("| claim | " + " | ".join(f"{n} {d}" for n, d in columns) + " | range at 16-32 | at 8 |")
    print("|---|" + "---|" * len(columns) + "---|---|")
    ranges: dict[str, dict[int, list[float]]] = {}
    for key in COVERED:
        by_count = {d: [share(cells[n, c][key]) for n, c in columns if c == d] for d in COUNTS}
        ranges[key] = by_count
        wide = by_count[16] + by_count[32]
        text = " | ".join(f"{share(cells[c][key]):.3f}" + (f" ({cells[c][key][2]})" if cells[c][key][2] else "")
                          for c in columns)
        print(f"| {key} | {text} | {min(wide):.2f}-{max(wide):.2f} | {min(by_count[8]):.2f}-{max(by_count[8]):.2f} |")
    return ranges


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny tensors: one thread is several times faster than contended ones
    arguments = [a for a in sys.argv[1:] if not a.startswith("--")]
    count = int(arguments[0]) if arguments else STUDIES
    if "--held-out-only" not in sys.argv:
        tuning_table(count)
    if "--tuning-only" not in sys.argv:
        held_out_table(count)
