"""Coverage of each claim's interval in sample (where its method was chosen) and out of sample.

Simulated studies (``tests/test_claim_coverage.py`` says how: every head has
known true means, each document scatters around them with skewed noise, the
package accumulates them with Poisson-bootstrap weights and `claims`
computes every interval) on:

- the tuning set: population ``TUNING`` at ``TUNING_DOCUMENTS`` documents,
  every interval method at the plain and the expanded level. Each claim's
  method and level (its declared ``interval`` in ``claims.CLAIMS``) are
  chosen from this table only, by a rule fixed before it was run (`pick`:
  the coverage closest to 0.95, a tie to the wider). Where every method
  covers less than 0.93 there, the same studies are read at higher nominal
  levels (``CALIBRATION_LEVELS``) and the rule picks among those too: the
  claim's level is calibrated on the tuning set (its ``interval.level``);
- the held-out populations (``HELD_OUT``: other seeds and other generating
  parameters) at 8, 16 and 32 documents, with the claims' own intervals.
  The acceptance is this table: every claim within 90-98 % at 16 and 32
  documents, stated at 8.

Coverage is the share of the studies whose interval covers the true value;
with ``STUDIES`` studies per cell its binomial standard error at 0.95 is
about 0.015 (200 studies). The last column gives each claim's held-out range
at 16 and 32 documents, and at 8. Stable norms by curve is also measured at
``GROUPED_DOCUMENTS`` (64) documents, past the 32 whose curves a result keeps
as rows: its curves are then kept in 32 groups of documents (an extra column).

``--set-intervals``: the claims of ``SET_CLAIMS`` (or ``--claim=KEY``), each with its declared bootstrap interval
joined with the set interval at every per-head z of ``SET_ZS`` on the tuning set (``SET_TUNING_STUDIES``
studies); `pick` chooses z there, and only then are the held-out populations run with that z beside the current
interval (``SET_HELD_OUT_STUDIES`` studies per cell, or ``studies``), with `uncertain`'s verdict for each.

``--at-thresholds``: the same for the z re-chosen where heads sit at the lines (docs/claims.md, "Set intervals tuned
where heads sit at the lines"): tuned on ``THRESHOLD_TUNING`` over ``AT_THRESHOLD_ZS``, held out on ``FRESH`` and
reported on ``HELD_OUT`` (seen), with the adoption rule's verdict per claim.

``--tradeoffs``: the same for trade-offs by role's set interval (docs/claims.md, "A set interval for trade-offs by
role"): tuned on ``THRESHOLD_TUNING`` over ``AT_THRESHOLD_ZS``, held out on ``TRADEOFF_FRESH`` and reported on
``FRESH`` and ``HELD_OUT`` (seen).

``--diagnose``: why large-N return and stable norms' reading within sequences miss on *near and noisy*
(docs/claims.md, "Why two intervals miss on near and noisy"): per cell of ``DIAGNOSED``, where the estimates and
intervals sit against the truth, and the parts each statistic is made of (no interval is chosen on these).

``--near-lines``: large-N return's method and the reading within sequences' set interval chosen by the rule written
before the run (docs/claims.md, "Why two intervals miss on near and noisy"): tuned on ``NEAR_TUNING`` (``pick``, the
candidates of `near_line_candidates`), held out on ``NEAR_FRESH`` and reported on ``TRADEOFF_FRESH``, ``FRESH`` and
``HELD_OUT`` (seen), with `uncertain`'s and `adopted`'s verdicts.

``--remeasure``: the held-out cells of ``REMEASURED`` (the two claims that
missed 0.90 by under one binomial standard error with 100 studies) measured
again with ``REMEASURE_STUDIES`` studies, the same seeded studies and more
of them (the first 100 are the 100-study cell's), each with its binomial
standard error and the verdict of `uncertain`, a rule written before these
cells were re-measured.

``--status``: every declared interval on the eleven held-out populations (``ALL_HELD_OUT``) at 8, 16 and 32
documents, 100 studies per cell on the tables' stream; then every cell at 16-32 documents under 0.90 of a claim not
declared uncertain, lowest first, measured again with ``REMEASURE_STUDIES`` studies of a new stream (``NEW_STREAM``),
with `uncertain`'s verdict per claim (docs/claims.md, "Every held-out cell under 0.90, measured again with new
studies"); with ``--thirteen`` on ``THIRTEEN`` (the two populations of ``ONE_SIDED_FRESH`` too). ``--tied``: why
two claims miss on *tied and skewed* (read after that run). ``--at-64``: every declared interval at
``GROUPED_DOCUMENTS`` documents on ``HELD_OUT`` (stated, not read by the status rule).
``--over-coverage``: what covers in the cells above 0.98 (exact estimates, the set interval, the bootstrap width).
``--one-sided``: stable norms by curve's and trade-offs by role's z re-chosen on ``ONE_SIDED_TUNING``, held out on
``ONE_SIDED_FRESH`` and ``ALL_HELD_OUT``, cells under 0.90 measured again (docs/claims.md, "Set intervals where heads
sit on one side of the line"). ``--above``: every declared interval's cells above 0.98 at 16-32 documents on the
thirteen populations (``THIRTEEN``), measured again with ``REMEASURE_STUDIES`` studies of ``ABOVE_STREAM``, over or
not (`over`); ``--band``: the same, then for each claim that over-covers its knob (per-head z or level) chosen on
those cells as a tuning set, held out on ``BAND_FRESH``, cells outside 90-98 % measured again, and the adoption
rule's verdict (docs/claims.md, "Above 0.98: measured again, and one setting for every population?").

    PYTHONPATH=. python benchmarks/bench_coverage.py [studies]
        [--tuning-only | --held-out-only | --grouped-only | --remeasure | --diagnose | --near-lines
         | --status [--thirteen] | --tied | --at-64 | --over-coverage | --one-sided | --above | --band
         | --set-intervals | --at-thresholds [--claim=KEY ...] | --tradeoffs]
        [--population=NAME ...]  (held-out populations to run; default all)
"""

import dataclasses
import math
import sys
import time
import warnings
from collections.abc import Callable
from statistics import NormalDist
from typing import TypeVar

import jaxtyping
import numpy as np
import torch

from tests.fixtures import Population, simulate_study, true_means
from tests.test_claim_coverage import (
    COVERED,
    Choice,
    Coverage,
    LARGE,
    MID,
    NEAR_FRESH,
    NEAR_TUNING,
    FRESH,
    HELD_OUT,
    ONE_SIDED_FRESH,
    ONE_SIDED_TUNING,
    BAND_FRESH,
    THRESHOLD_TUNING,
    TRADEOFF_FRESH,
    TUNING,
    TUNING_DOCUMENTS,
    chosen,
    coverage,
    estimate,
    every_choice,
    set_choices,
    share,
    true_values,
)
from tl_geometry import claims
from tl_geometry.analysis.claims import _curve_cvs
from tl_geometry.analysis.set_intervals import replicate_standard_errors

STUDIES = 200
NOMINAL = 0.95
CALIBRATE_BELOW = 0.93  # a claim whose every method covers less on the tuning set is read at a higher level ...
CALIBRATION_LEVELS = (0.975, 0.99, 0.995)  # ... one of these (the rule's pick among them and the 0.95 ones)
COUNTS = (8, 16, 32)
GROUPED_DOCUMENTS = 64  # stable norms by curve past the 32 documents kept as rows: read from 32 groups
TARGET = 0.90  # the held-out acceptance's lower edge, at 16 and 32 documents
REMEASURE_STUDIES = 400
REMEASURED = (("large_n_return", "skewed", 16), ("sink_recall_correlation", "skewed", 32))
SET_CLAIMS = ("stable_norms", "roles_by_depth", "four_phase_profile")  # heads judged against thresholds
SET_ZS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)  # the per-head z the rule picks from (on the tuning set only)
SET_TUNING_STUDIES = 300
AT_THRESHOLD_ZS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0)  # the z re-chosen on THRESHOLD_TUNING (--at-thresholds)
SET_HELD_OUT_STUDIES = 100
ALL_HELD_OUT = {**HELD_OUT, **FRESH, **TRADEOFF_FRESH, **NEAR_FRESH}  # every population held out from some choice
TIED = (("tied and skewed", 16), ("tied and skewed", 32), ("crowded", 32))  # two misses; heads at the line that cover
NEW_STREAM = 1  # the re-measured cells' studies: seeds (population seed, documents, 1), none of the first stream's
OVER = 0.98  # a cell covering more than this at 16-32 documents is counted as over-covering
EXACT = 1e-6  # an estimate this close to the truth is exact (the claims compute in float32, the truth in float64)
ONE_SIDED_CLAIMS = ("stable_norms", "role_tradeoffs")  # uncertain since *tied and skewed*; z re-chosen (--one-sided)
ABOVE_STREAM = 2  # cells above 0.98 measured again: seeds (population seed, documents, 2), none of streams 0 and 1
OVER_TAIL = 0.025  # a re-measured cell is over when a count this high had under this chance at a true coverage OVER
WIDE = (16, 32)  # the document counts of the acceptance (docs/claims.md, "Above 0.98")
BAND = (TARGET, OVER)  # the acceptance: every cell at 16-32 documents within it (point figures)
BAND_ZS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)  # the per-head z's grid (--band), with the declared
BAND_LEVELS = (0.80, 0.85, 0.90, 0.925, 0.95, 0.975, 0.99, 0.995)  # a bootstrap interval's levels, with the declared
THIRTEEN = {**ALL_HELD_OUT, **ONE_SIDED_FRESH}  # every population held out so far: --band's tuning cells
DIAGNOSED = (("near and noisy", 8), ("near and noisy", 16), ("near and noisy", 32), ("few heads", 16),
             ("many heads", 16))  # the two misses' cells, and two cells of populations drawn with them that cover

T = TypeVar("T")


def _timed(label: str, measure: Callable[[], T]) -> T:
    """``measure()``, its time told on stderr as ``label: N s`` (the tables go to stdout)."""
    start = time.perf_counter()
    out = measure()
    print(f"{label}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return out


def _cells(label: str, populations: dict[str, Population], studies: int, choices: dict | None = None,
           counts: tuple[int, ...] = COUNTS, stream: int = 0,
           records: dict[tuple[str, int], dict] | None = None) -> dict[tuple[str, int], dict[str, Coverage]]:
    """`coverage` of ``choices`` on each population at each of ``counts`` documents (studies of ``stream``), each
    cell's time on stderr; ``records`` receives each cell's `coverage` record under (population, documents)."""
    return {(name, documents): _timed(
                f"{label} {name}, {documents} documents",
                lambda: coverage(population, documents, studies, choices, stream=stream,
                                 record=None if records is None else records.setdefault((name, documents), {})))
            for name, population in populations.items() for documents in counts}


def standard_error(cell: tuple[int, int, int]) -> float:
    """The binomial standard error of a cell's coverage, from its own coverage and number of studies."""
    c = share(cell)
    return math.sqrt(c * (1 - c) / max(1, cell[1]))


def uncertain(cells: list[tuple[int, int, int]]) -> bool:
    """The rule, written before the cells of ``REMEASURED`` were measured again: a claim's interval is uncertain
    when some held-out cell at 16 or 32 documents covers under 0.90 by more than its binomial noise, that is
    coverage + 2 standard errors < 0.90."""
    return any(share(cell) + 2 * standard_error(cell) < TARGET for cell in cells)


def pick(found: dict, key: str) -> str:
    """The rule, fixed before the tuning run: the choice whose tuning coverage (to 3 digits) is closest to the
    nominal 0.95, a tie going to the higher coverage (the wider interval)."""
    shares = {name: round(share(cells[key]), 3) for name, cells in found.items() if name != "chosen" and cells[key][1]}
    return min(shares, key=lambda name: (abs(shares[name] - NOMINAL), -shares[name]))


def tuning_table(studies: int) -> None:
    start = time.perf_counter()
    found = coverage(TUNING, TUNING_DOCUMENTS, studies, every_choice())
    print(f"tuning: population seed {TUNING.seed}, {TUNING_DOCUMENTS} documents, {studies} studies "
          f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    short = tuple(key for key in COVERED if max(share(cells[key]) for cells in found.values()) < CALIBRATE_BELOW)
    if short:  # no method covers: the same studies read at higher levels, for those claims only
        start = time.perf_counter()
        wider = coverage(TUNING, TUNING_DOCUMENTS, studies, every_choice(short, CALIBRATION_LEVELS))
        found.update({name: cells for name, cells in wider.items() if name != "chosen"})
        print(f"calibration of {', '.join(short)}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    plain = list(every_choice())  # the methods at the nominal level, either expanded or not
    own = chosen()

    def described(choice) -> str:
        return (f"{choice.method}, {'expanded' if choice.expanded else 'plain'}"
                + ("" if choice.level == NOMINAL else f", {choice.level:g}")
                + ("" if choice.per_head_z is None else f", set interval at z = {choice.per_head_z:g}"))

    print(f"\nTuning set (population seed {TUNING.seed}, {TUNING_DOCUMENTS} documents, {studies} studies): coverage "
          "of nominal 95 % intervals")
    print(f"| claim | {' | '.join(plain)} | rule's pick | chosen |\n|---|{'---|' * len(plain)}---|---|")
    for key in COVERED:
        cells = " | ".join(f"{share(found[name][key]):.3f}" for name in plain)
        print(f"| {key} | {cells} | {pick(found, key)} | {described(own[key])} |")
    if short:
        print(f"\nCalibration (every method under {CALIBRATE_BELOW} at the nominal level): the same studies read at "
              "higher levels; the rule picks among these and the nominal ones")
        print(f"| claim, level | {' | '.join(plain)} |\n|---|{'---|' * len(plain)}")
        for key in short:
            for level in CALIBRATION_LEVELS:
                cells = " | ".join(f"{share(found[f'{name}, {level:g}'][key]):.3f}" for name in plain)
                print(f"| {key}, {level:g} | {cells} |")


def held_out_table(studies: int, names: list[str]) -> dict[str, dict[int, list[float]]]:
    found = _cells("held out", {name: HELD_OUT[name] for name in names}, studies)
    cells = {at: cell["chosen"] for at, cell in found.items()}
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
    grouped_table(studies, names)
    return ranges


def grouped_table(studies: int, names: list[str]) -> None:
    """Stable norms by curve at ``GROUPED_DOCUMENTS`` documents on the held-out populations ``names`` (the other
    claims' cells are not read: their intervals were validated at 8-32 documents)."""
    grouped = {}
    for name in names:
        grouped[name] = _timed(
            f"held out {name}, {GROUPED_DOCUMENTS} documents",
            lambda: coverage(HELD_OUT[name], GROUPED_DOCUMENTS, studies)["chosen"]["stable_norms"],
        )
    print(f"\nStable norms by curve at {GROUPED_DOCUMENTS} documents (32 groups of documents; {studies} studies per "
          "cell): " + ", ".join(f"{name} {share(cell):.3f}" + (f" ({cell[2]})" if cell[2] else "")
                                for name, cell in grouped.items()))


def remeasured_table(studies: int) -> None:
    """The cells of ``REMEASURED`` with 100 studies (the first 100 of the seeded studies) and with ``studies``."""
    print(f"\nRe-measured held-out cells: 100 and {studies} studies (the first 100 the same), binomial standard "
          "errors in brackets; the rule: uncertain if coverage + 2 SE < 0.90")
    print(f"| claim | cell | 100 studies | {studies} studies | coverage + 2 SE < 0.90 |\n|---|---|---|---|---|")
    for key, name, documents in REMEASURED:
        start = time.perf_counter()
        few = coverage(HELD_OUT[name], documents, 100)["chosen"][key]
        many = coverage(HELD_OUT[name], documents, studies)["chosen"][key]
        print(f"re-measured {key} on {name} at {documents}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        print(f"| {key} | {name} {documents} | {share(few):.3f} ({standard_error(few):.3f}) | {share(many):.3f} "
              f"({standard_error(many):.3f}) | {'yes' if uncertain([many]) else 'no'} |")


def _cell_text(cell: tuple[int, int, int], digits: int = 2) -> str:
    return f"{share(cell):.{digits}f}" + (f" ({cell[2]})" if cell[2] else "")


def status_tables(studies: int, remeasure_studies: int,
                  populations: dict[str, Population] = ALL_HELD_OUT) -> None:
    """The rule of docs/claims.md, "Every held-out cell under 0.90, measured again with new studies": the declared
    intervals on ``populations`` (``ALL_HELD_OUT``; ``THIRTEEN`` with ``--thirteen``) at ``COUNTS`` (``studies`` per
    cell, the tables' stream), the cells above 0.98 and under 0.90 at 16-32 documents counted per claim; then the listed cells (under 0.90, a claim not declared
    uncertain), lowest first, with ``remeasure_studies`` studies of ``NEW_STREAM`` and `uncertain`'s verdict."""
    declared = chosen()
    cells = {at: cell["chosen"] for at, cell in _cells("status", populations, studies).items()}
    names = list(populations)
    print(f"\nThe declared intervals held out ({studies} studies per cell, the tables' stream; in brackets the "
          "estimates outside their own interval)")
    print("| claim | " + " | ".join(f"{n} {d}" for n in names for d in COUNTS)
          + " | 16-32 | 8 | under 0.90 at 16-32 | above 0.98 at 16-32 |")
    print("|---|" + "---|" * (len(names) * len(COUNTS)) + "---|---|---|---|")
    for key in COVERED:
        wide = [share(cells[n, d][key]) for n in names for d in (16, 32)]
        eight = [share(cells[n, 8][key]) for n in names]
        text = " | ".join(_cell_text(cells[n, d][key]) for n in names for d in COUNTS)
        print(f"| {key} | {text} | {min(wide):.2f}-{max(wide):.2f} | {min(eight):.2f}-{max(eight):.2f} | "
              f"{sum(c < TARGET for c in wide)} | {sum(c > 0.98 for c in wide)} of {len(wide)} |")
    listed = sorted((share(cells[n, d][key]), key, n, d) for key in COVERED if declared[key].uncertain is None
                    for n in names for d in (16, 32) if share(cells[n, d][key]) < TARGET)
    print(f"\nListed (under {TARGET} at 16-32 documents, a claim not declared uncertain), lowest first: "
          + "; ".join(f"{key} on {n} at {d} ({c:.2f})" for c, key, n, d in listed))
    print(f"\n| claim | cell | {studies} studies (SE) | {remeasure_studies} new studies (SE) | "
          "coverage + 2 SE < 0.90 |\n|---|---|---|---|---|", flush=True)
    again: dict[tuple[str, int], Coverage] = {}
    replaced = {}
    for _, key, name, documents in listed:
        if (name, documents) not in again:
            again[name, documents] = _timed(
                f"re-measured {name}, {documents} documents",
                lambda: coverage(populations[name], documents, remeasure_studies, stream=NEW_STREAM)["chosen"],
            )
        few, many = cells[name, documents][key], again[name, documents][key]
        replaced[key, name, documents] = many
        print(f"| {key} | {name} {documents} | {_cell_text(few, 3)} ({standard_error(few):.3f}) | "
              f"{_cell_text(many, 3)} ({standard_error(many):.3f}) | {'yes' if uncertain([many]) else 'no'} |",
              flush=True)
    print("\nStatus (the rule written before the run):")
    for key in dict.fromkeys(key for _, key, _, _ in listed):
        wide = [replaced.get((key, n, d), cells[n, d][key]) for n in names for d in (16, 32)]
        again_cells = [replaced[k] for k in replaced if k[0] == key]
        verdict = "uncertain" if uncertain(again_cells) else "not uncertain"
        print(f"- {key}: {verdict}; held-out range at 16-32 documents {min(map(share, wide)):.3f}-"
              f"{max(map(share, wide)):.3f} with the re-measured cells")


def over_coverage_table(studies: int) -> None:
    """The cells above ``OVER`` at 16-32 documents of the declared intervals on ``ALL_HELD_OUT`` (``studies`` per
    cell, the tables' stream: the studies of the status table), and what covers in them (docs/claims.md,
    "Over-coverage"): per claim, the studies whose estimate equals the truth (within ``EXACT``) or whose interval
    has zero width, and the studies covered only because of the set interval (the declared bootstrap interval
    alone, without ``per_head_z``, misses); the rest are covered by the bootstrap interval's width."""
    declared = chosen()
    alone = {"alone": {k: dataclasses.replace(c, per_head_z=None) for k, c in declared.items()
                       if c.per_head_z is not None}}
    counts = {key: [0] * 6 for key in COVERED}  # cells, studies, covered, exact or zero width, set only, exact misses
    for name, population in ALL_HELD_OUT.items():
        for documents in (16, 32):
            start = time.perf_counter()
            record: dict = {}
            cells = coverage(population, documents, studies, alone, record=record)
            truth = true_values(true_means(population), documents, population)
            print(f"over-coverage {name}, {documents} documents: {time.perf_counter() - start:.0f} s", file=sys.stderr)
            for key in COVERED:
                if share(cells["chosen"][key]) <= OVER:
                    continue
                t = truth[key]
                own = np.array(record[("chosen", key)])
                by_itself = np.array(record[("alone", key)]) if ("alone", key) in record else own
                covers = (own[:, 1] <= t) & (t <= own[:, 2])
                exact = (abs(own[:, 0] - t) <= EXACT) | (own[:, 2] - own[:, 1] <= 0)
                bootstrap = (by_itself[:, 1] <= t) & (t <= by_itself[:, 2])
                found = counts[key]
                found[0] += 1
                found[1] += len(own)
                found[2] += int(covers.sum())
                found[3] += int((covers & exact).sum())
                found[4] += int((covers & ~exact & ~bootstrap).sum())
                found[5] += int((~covers & exact).sum())
    print(f"\nOver-coverage: the cells above {OVER} at 16-32 documents ({studies} studies per cell, the tables' "
          "stream), pooled per claim")
    print("| claim | cells | studies | covered | exact or zero width | covered only by the set interval | covered by "
          "the bootstrap interval, not exact | coverage of the studies not exact |\n|---|---|---|---|---|---|---|---|")
    for key, (cells_, n, covered, exact, set_only, missed) in counts.items():
        if cells_:
            rest = n - exact - missed
            print(f"| {key} | {cells_} | {n} | {covered} | {exact} | {set_only} | {covered - exact - set_only} | "
                  f"{(covered - exact) / max(1, rest):.3f} ({covered - exact} of {rest}) |")


def one_sided_tables(tuning_studies: int, held_out_studies: int, remeasure_studies: int) -> None:
    """The rule of docs/claims.md, "Set intervals where heads sit on one side of the line": for the claims of
    ``ONE_SIDED_CLAIMS``, `pick` over ``AT_THRESHOLD_ZS`` on ``ONE_SIDED_TUNING`` at ``TUNING_DOCUMENTS`` documents
    (``tuning_studies``); then the picked z beside the current interval on ``ONE_SIDED_FRESH`` and ``ALL_HELD_OUT``
    at ``COUNTS`` (``held_out_studies`` per cell, the tables' stream); every cell at 16-32 documents where the
    picked z covers under ``TARGET`` measured again with ``remeasure_studies`` studies of ``NEW_STREAM`` (both
    intervals on the same studies); `uncertain`'s and `adopted`'s verdicts on the cells, re-measured ones
    replacing their 100-study figures."""
    keys = ONE_SIDED_CLAIMS
    found = _timed(
        "one-sided tuning",
        lambda: coverage(ONE_SIDED_TUNING, TUNING_DOCUMENTS, tuning_studies, set_choices(keys, AT_THRESHOLD_ZS)),
    )
    names_z = [name for name in found if name != "chosen"]
    print(f"\nTuning (ONE_SIDED_TUNING, seed {ONE_SIDED_TUNING.seed}, {TUNING_DOCUMENTS} documents, {tuning_studies} "
          "studies): the declared bootstrap interval joined with the set interval at each z")
    print(f"| claim | current | {' | '.join(names_z)} | the rule's pick |\n|---|---|{'---|' * len(names_z)}---|")
    picked = {}
    for key in keys:
        picked[key] = pick(found, key)
        cells = " | ".join(f"{share(found[name][key]):.3f}" for name in names_z)
        print(f"| {key} | {share(found['chosen'][key]):.3f} | {cells} | {picked[key]} |", flush=True)
    choice = {"picked": {key: set_choices((key,), (float(picked[key].split("= ")[1]),))[picked[key]][key]
                         for key in keys}}
    populations = {**ONE_SIDED_FRESH, **ALL_HELD_OUT}
    cells = _cells("one-sided held out", populations, held_out_studies, choice)
    names = list(populations)
    again: dict[tuple[str, int], dict] = {}
    for name in names:
        for documents in (16, 32):
            if any(share(cells[name, documents]["picked"][key]) < TARGET for key in keys):
                again[name, documents] = _timed(
                    f"one-sided re-measured {name}, {documents} documents",
                    lambda: coverage(populations[name], documents, remeasure_studies, choice, stream=NEW_STREAM),
                )
    print(f"\nHeld out ({held_out_studies} studies per cell; in brackets estimates outside their own interval; "
          f"after ';' a cell's {remeasure_studies} new studies)")
    print("| claim | interval | " + " | ".join(f"{n} {d}" for n in names for d in COUNTS)
          + " | 16-32, new fresh | 16-32, all | 8 | uncertain |")
    print("|---|---|" + "---|" * (len(names) * len(COUNTS)) + "---|---|---|---|")
    final: dict[tuple[str, str], list] = {}
    for key in keys:
        current_z = chosen()[key].per_head_z
        for label, which in ((f"current, z = {current_z:g}", "chosen"), (picked[key], "picked")):
            def cell(n: str, d: int):  # the re-measured figure where there is one
                return again[n, d][which][key] if (n, d) in again else cells[n, d][which][key]

            text = " | ".join(_cell_text(cells[n, d][which][key])
                              + (f"; {_cell_text(again[n, d][which][key], 3)}" if (n, d) in again else "")
                              for n in names for d in COUNTS)
            wide = [cell(n, d) for n in names for d in (16, 32)]
            fresh = [share(cell(n, d)) for n in ONE_SIDED_FRESH for d in (16, 32)]
            eight = [share(cells[n, 8][which][key]) for n in names]
            final[key, which] = wide
            remeasured = [again[n, d][which][key] for n, d in again]
            print(f"| {key} | {label} | {text} | {min(fresh):.3f}-{max(fresh):.3f} | "
                  f"{min(map(share, wide)):.3f}-{max(map(share, wide)):.3f} | {min(eight):.2f}-{max(eight):.2f} | "
                  f"{'yes' if uncertain(remeasured) else 'no'} |", flush=True)
    print("\nAdoption (the rule written before the run; uncertain from the re-measured cells):")
    for key in keys:
        remeasured = [again[n, d]["picked"][key] for n, d in again]
        low, high = min(map(share, final[key, "picked"])), max(map(share, final[key, "picked"]))
        before = min(map(share, final[key, "chosen"]))
        if not uncertain(remeasured):
            verdict = f"adopted, not uncertain ({low:.3f}-{high:.3f})"
        elif low > before:
            verdict = f"adopted, still uncertain ({low:.3f}-{high:.3f}; the current interval's lowest {before:.3f})"
        else:
            verdict = f"not adopted: uncertain and its lowest cell {low:.3f} not above the current's {before:.3f}"
        print(f"- {key}, {picked[key]}: {verdict}")


def upper_tail(count: int, n: int, p: float) -> float:
    """P(X >= count) for X binomial with ``n`` trials of probability ``p``, summed term by term."""
    return math.fsum(math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(max(count, 0), n + 1))


def over_count(n: int, p: float = OVER, tail: float = OVER_TAIL) -> int:
    """The smallest count of ``n`` studies that a cell whose true coverage is ``p`` reaches or passes with
    probability under ``tail`` (the exact binomial upper tail); ``n + 1`` where no count is that rare."""
    return next((k for k in range(n + 1) if upper_tail(k, n, p) < tail), n + 1)


def over(cell: tuple[int, int, int]) -> bool:
    """The rule of docs/claims.md, "Above 0.98": a re-measured cell is over when it covers ``over_count`` or more
    of its studies."""
    return cell[1] > 0 and cell[0] >= over_count(cell[1])


def nesting_failures(by_knob: list[list[tuple[float, float, float]]],
                     tolerance: float = 0.0) -> list[tuple[int, int]]:
    """Each candidate's intervals (value, low, high) per study, in increasing order of the knob: the (candidate,
    study) pairs where a candidate's interval does not contain the one before it, widened by ``tolerance`` (study
    -1: the two have intervals on different numbers of studies, so they cannot be compared study by study)."""
    found = []
    for i in range(1, len(by_knob)):
        inner, outer = (np.asarray(by_knob[j], dtype=float).reshape(-1, 3) for j in (i - 1, i))
        if len(inner) != len(outer):
            found.append((i, -1))
            continue
        wider = (outer[:, 1] <= inner[:, 1] + tolerance) & (outer[:, 2] >= inner[:, 2] - tolerance)
        found += [(i, int(j)) for j in np.flatnonzero(~wider)]
    return found


def _again(label: str, cells: list[tuple[str, int]], studies: int,
           choices: dict | None = None) -> dict[tuple[str, int], dict[str, Coverage]]:
    """The (population, documents) pairs of ``cells``, each once, with ``studies`` studies of ``ABOVE_STREAM``."""
    populations = {**THIRTEEN, **BAND_FRESH}
    return {(name, documents): _timed(
                f"{label} {name}, {documents} documents",
                lambda: coverage(populations[name], documents, studies, choices, stream=ABOVE_STREAM))
            for name, documents in dict.fromkeys(cells)}


def above_tables(studies: int, remeasure_studies: int) -> list[str]:
    """The rule of docs/claims.md, "Above 0.98: measured again, and one setting for every population?", its first
    part: the declared intervals on ``THIRTEEN`` at 16-32 documents (``studies`` per cell, stream 0); every cell
    above ``OVER`` measured again with ``remeasure_studies`` studies of ``ABOVE_STREAM``, over or not (`over`).
    Returns the claims whose interval over-covers (some re-measured cell over)."""
    cells = {at: cell["chosen"] for at, cell in _cells("above", THIRTEEN, studies, counts=WIDE).items()}
    names = list(THIRTEEN)
    print(f"\nThe declared intervals at 16-32 documents on the thirteen populations ({studies} studies per cell, "
          "stream 0)")
    print("| claim | " + " | ".join(f"{n} {d}" for n in names for d in WIDE) + " |\n|---|"
          + "---|" * (len(names) * len(WIDE)))
    for key in COVERED:
        print(f"| {key} | " + " | ".join(_cell_text(cells[n, d][key]) for n in names for d in WIDE) + " |")
    listed = [(key, n, d) for key in COVERED for n in names for d in WIDE if share(cells[n, d][key]) > OVER]
    again = {at: cell["chosen"] for at, cell in
             _again("above re-measured", [(n, d) for _, n, d in listed], remeasure_studies).items()}
    least = over_count(remeasure_studies)
    each = {p: upper_tail(math.floor(OVER * studies) + 1, studies, p) for p in (OVER, NOMINAL)}  # above OVER
    print(f"\nListed (above {OVER} with {studies} studies), measured again with {remeasure_studies} studies of stream "
          f"{ABOVE_STREAM}; over: {least} of {remeasure_studies} or more (P = {upper_tail(least, remeasure_studies, OVER):.4f}"
          f" at {OVER}; {least - 1} or more: {upper_tail(least - 1, remeasure_studies, OVER):.4f}). A {studies}-study "
          f"cell reads above {OVER} with probability {each[OVER]:.3f} at {OVER}, {each[NOMINAL]:.3f} at {NOMINAL}")
    print(f"| claim | cell | {studies} studies | {remeasure_studies} studies, stream {ABOVE_STREAM} | over |\n"
          "|---|---|---|---|---|")
    for key, n, d in listed:
        print(f"| {key} | {n} {d} | {_cell_text(cells[n, d][key], 3)} | {_cell_text(again[n, d][key], 3)} "
              f"({again[n, d][key][0]} of {again[n, d][key][1]}) | {'yes' if over(again[n, d][key]) else 'no'} |")
    print(f"\n| claim | cells above {OVER} of {len(names) * len(WIDE)} | expected at {OVER} | expected at {NOMINAL} | "
          "re-measured over | over-covers |\n|---|---|---|---|---|---|")
    covering = []
    for key in COVERED:
        mine = [(n, d) for k, n, d in listed if k == key]
        overs = [at for at in mine if over(again[at][key])]
        if overs:
            covering.append(key)
        total = len(names) * len(WIDE)
        print(f"| {key} | {len(mine)} | {total * each[OVER]:.1f} | {total * each[NOMINAL]:.1f} | {len(overs)} of "
              f"{len(mine)} | {'yes' if overs else 'no'} |", flush=True)
    return covering


def knob_choices(keys: tuple[str, ...]) -> dict[str, dict[str, Choice]]:
    """Per claim of ``keys``, its knob's candidates by name: the declared interval with the per-head z at each of
    ``BAND_ZS`` and the declared z where it is joined with a set interval ("set, z = 1.5", `set_choices`), else
    with its nominal level at each of ``BAND_LEVELS`` and the declared level ("level = 0.99"), in increasing order."""
    declared = chosen()
    found = {}
    for key in keys:
        if declared[key].per_head_z is not None:
            found[key] = set_choices((key,), tuple(sorted({*BAND_ZS, declared[key].per_head_z})))
        else:
            found[key] = {f"level = {level:g}": {key: dataclasses.replace(declared[key], level=level, uncertain=None)}
                          for level in sorted({*BAND_LEVELS, declared[key].level})}
    return found


def _knob(name: str) -> float:
    return float(name.split("= ")[1])


def band_tables(studies: int, remeasure_studies: int, keys: list[str]) -> None:
    """The rule of docs/claims.md, "Above 0.98", its second part, for the claims ``keys`` (those that over-cover):
    every candidate of `knob_choices` on the tuning cells (``THIRTEEN`` at 16-32 documents, ``studies`` each, stream
    0), their nesting checked study by study; the pick (most cells within ``BAND``, a tie to the larger knob) and
    each population's range of knobs within it; the pick beside the declared interval on ``BAND_FRESH`` at
    ``COUNTS``; every cell at 16-32 documents where the pick lies outside ``BAND`` measured again with
    ``remeasure_studies`` studies of ``ABOVE_STREAM``; and the adoption rule's verdict per claim."""
    if not keys:
        print("\nNo claim over-covers: nothing to choose.")
        return
    candidates = knob_choices(tuple(keys))
    merged: dict[str, Choice] = {}
    for by_name in candidates.values():
        for name, choice in by_name.items():
            merged.setdefault(name, {}).update(choice)
    records: dict[tuple[str, int], dict] = {}
    tuning = _cells("band tuning", THIRTEEN, studies, merged, counts=WIDE, records=records)
    names, low, high = list(THIRTEEN), *BAND
    inside = lambda cell: low <= share(cell) <= high  # noqa: E731
    picked: dict[str, str] = {}
    for key in keys:
        grid = list(candidates[key])
        print(f"\nTuning cells of {key} ({studies} studies each, stream 0; declared: {chosen()[key]})")
        print("| cell | " + " | ".join(grid) + " | nesting failures |\n|---|" + "---|" * (len(grid) + 1))
        for at in tuning:
            failures = nesting_failures([records[at][name, key] for name in grid], EXACT)  # float32 rounding
            print(f"| {at[0]} {at[1]} | " + " | ".join(_cell_text(tuning[at][name][key]) for name in grid)
                  + f" | {len(failures)}{': ' + str(failures[:5]) if failures else ''} |")
        counts = {name: sum(inside(tuning[at][name][key]) for at in tuning) for name in grid}
        picked[key] = max(grid, key=lambda name: (counts[name], _knob(name)))
        print("cells within [0.90, 0.98]: " + ", ".join(f"{name} {c}" for name, c in counts.items())
              + f"; the pick: {picked[key]}")
        print("each population's knobs with both cells within [0.90, 0.98]: " + "; ".join(
            f"{n} " + (", ".join(f"{_knob(name):g}" for name in grid
                                 if all(inside(tuning[n, d][name][key]) for d in WIDE)) or "none")
            for n in names), flush=True)
    choice = {"picked": {key: candidates[key][picked[key]][key] for key in keys}}
    fresh = _cells("band fresh", BAND_FRESH, studies, choice)
    print(f"\nFresh held-out populations ({studies} studies per cell, stream 0): declared, then picked")
    print("| claim | interval | " + " | ".join(f"{n} {d}" for n in BAND_FRESH for d in COUNTS) + " |\n|---|---|"
          + "---|" * (len(BAND_FRESH) * len(COUNTS)))
    for key in keys:
        for label, which in (("declared", "chosen"), (picked[key], "picked")):
            print(f"| {key} | {label} | " + " | ".join(_cell_text(fresh[n, d][which][key])
                                                       for n in BAND_FRESH for d in COUNTS) + " |")
    at_pick = {**{(key, n, d): tuning[n, d][picked[key]][key] for key in keys for n, d in tuning},
               **{(key, n, d): fresh[n, d]["picked"][key] for key in keys for n, d in fresh if d in WIDE}}
    outside = [(key, n, d) for (key, n, d), cell in at_pick.items() if not inside(cell)]
    again = _again("band re-measured", [(n, d) for _, n, d in outside], remeasure_studies, choice)
    print(f"\nRe-measured ({remeasure_studies} studies of stream {ABOVE_STREAM}; the pick outside [0.90, 0.98] with "
          f"{studies}): under: c + 2 SE < 0.90; over: {over_count(remeasure_studies)} of {remeasure_studies} or more")
    print(f"| claim | cell | pick, {studies} studies | pick, {remeasure_studies} | declared, {remeasure_studies} | "
          "under | over |\n|---|---|---|---|---|---|---|")
    for key, n, d in outside:
        mine = again[n, d]["picked"][key]
        print(f"| {key} | {n} {d} | {_cell_text(at_pick[key, n, d], 3)} | {_cell_text(mine, 3)} | "
              f"{_cell_text(again[n, d]['chosen'][key], 3)} | {'yes' if uncertain([mine]) else 'no'} | "
              f"{'yes' if over(mine) else 'no'} |")
    print("\nAdoption (the rule written before the run):")
    for key in keys:
        mine = [again[n, d]["picked"][key] for k, n, d in outside if k == key]
        under_, over_ = sum(uncertain([c]) for c in mine), sum(map(over, mine))
        verdict = "adopted" if not under_ and not over_ else "not adopted"
        print(f"- {key}, {picked[key]}: {verdict} ({len(mine)} re-measured, {under_} under, {over_} over)")


def tied_table(studies: int) -> None:
    """Why stable norms by curve and trade-offs by role miss on *tied and skewed* (docs/claims.md, "Every held-out
    cell under 0.90, measured again with new studies"), read after the run, nothing chosen on it: per cell of
    ``TIED``, on the tables' stream (``studies`` studies, the listing's own), where both claims' intervals sit
    against the truth; and for stable norms by curve each head whose true curve CV lies within one estimate's
    spread of 0.05: the truth, its estimates' mean and spread, and how often its own interval at the declared z
    lies wholly on the wrong side of the line (the head judged certainly past it, or certainly not)."""
    jaxtyping.config.jaxtyping_disable = True  # the package's own tests check the shapes; here, speed
    torch.set_num_threads(1)
    z = chosen()["stable_norms"].per_head_z
    keys = ("stable_norms", "role_tradeoffs")
    print(f"\nWhy two claims miss on tied and skewed ({studies} studies per cell, the tables' stream)")
    print("| cell | claim | truth | estimate's mean (sd) | covers | misses above / below the truth |\n"
          "|---|---|---|---|---|---|")
    heads = []
    for name, documents in TIED:
        population = ALL_HELD_OUT[name]
        means = true_means(population)
        truth = true_values(means, documents, population)
        curve = means["value_norm_by_position"][..., 1:]
        cv = (curve.std(-1) / curve.mean(-1)).ravel()  # the truth's curve CV per head, as `true_values` reads it
        rng = np.random.default_rng((population.seed, documents))  # as `coverage` seeds its studies
        found, cvs, errors = {key: [] for key in keys}, [], []
        for _ in range(studies):
            result = simulate_study(means, rng, documents, population)
            table = claims(result)
            for key in keys:
                found[key].append(estimate(table, key))
            across, replicates = _curve_cvs(result)  # the claim's own per-head CVs and their replicates
            cvs.append(across.double().numpy().ravel())
            errors.append(replicate_standard_errors(replicates, result.stats["value_norm_by_position"].n_units)
                          .double().numpy().ravel())
        for key in keys:
            a, t = np.array(found[key]), truth[key]
            print(f"| {name} {documents} | {key} | {t:.3f} | {a[:, 0].mean():.3f} ({a[:, 0].std():.3f}) | "
                  f"{np.mean((a[:, 1] <= t) & (t <= a[:, 2])):.2f} | {np.mean(a[:, 1] > t):.2f} / "
                  f"{np.mean(a[:, 2] < t):.2f} |")
        x, se = np.array(cvs), np.array(errors)
        for h in np.flatnonzero(abs(cv - 0.05) <= x.std(0)):
            wrong = x[:, h] + z * se[:, h] <= 0.05 if cv[h] > 0.05 else x[:, h] - z * se[:, h] > 0.05
            heads.append(f"| {name} {documents} | {h} | {cv[h]:.4f} | {x[:, h].mean():.4f} ({x[:, h].std():.4f}) | "
                         f"{wrong.mean():.2f} |")
    print(f"\n| cell | head | true curve CV | estimate's mean (sd) | judged certainly on the wrong side at z = {z:g} |"
          "\n|---|---|---|---|---|")
    print("\n".join(heads))


def at_64_table(studies: int) -> None:
    """Every declared interval at ``GROUPED_DOCUMENTS`` documents on ``HELD_OUT`` (``studies`` per cell): stated
    beside the acceptance's 16-32 documents, not read by the status rule."""
    cells = {}
    for name, population in HELD_OUT.items():
        cells[name] = _timed(
            f"{name}, {GROUPED_DOCUMENTS} documents",
            lambda: coverage(population, GROUPED_DOCUMENTS, studies)["chosen"],
        )
    print(f"\nThe declared intervals at {GROUPED_DOCUMENTS} documents ({studies} studies per cell; stated, not "
          "acceptance)")
    print("| claim | " + " | ".join(cells) + " |\n|---|" + "---|" * len(cells))
    for key in COVERED:
        print(f"| {key} | " + " | ".join(_cell_text(cells[n][key]) for n in cells) + " |")


def set_interval_tables(tuning_studies: int, held_out_studies: int, keys: tuple[str, ...], names: list[str],
                        tuning: Population = TUNING, zs: tuple[float, ...] = SET_ZS,
                        populations: dict[str, Population] = HELD_OUT) -> None:
    """The set intervals (docs/claims.md, "Set intervals"), for the claims ``keys``: each claim's declared bootstrap
    interval joined with the set interval at every z of ``zs`` on the ``tuning`` population (``tuning_studies``
    studies); `pick` chooses z there, by the rule written before this was run; then, with that z only, the
    ``populations`` named ``names`` at ``COUNTS`` (and ``GROUPED_DOCUMENTS`` for stable norms by curve),
    ``held_out_studies`` studies per cell, beside the claim's current interval on the same studies, with
    `uncertain`'s verdict and the adoption rule's (`adopted`)."""
    found = _timed(
        "set intervals, tuning",
        lambda: coverage(tuning, TUNING_DOCUMENTS, tuning_studies, set_choices(keys, zs)),
    )
    print(f"\nSet intervals on the tuning set (population seed {tuning.seed}, {TUNING_DOCUMENTS} documents, "
          f"{tuning_studies} studies): coverage of each claim's bootstrap interval joined with the set interval at z")
    names_z = [name for name in found if name != "chosen"]
    print(f"| claim | current | {' | '.join(names_z)} | rule's pick |\n|---|---|{'---|' * len(names_z)}---|")
    picked = {}
    for key in keys:
        picked[key] = pick(found, key)
        cells = " | ".join(f"{share(found[name][key]):.3f}" for name in names_z)
        print(f"| {key} | {share(found['chosen'][key]):.3f} | {cells} | {picked[key]} |")
    chosen_set = {key: set_choices((key,), (float(picked[key].split("= ")[1]),))[picked[key]][key] for key in keys}
    print(f"\nSet intervals held out ({held_out_studies} studies per cell): the current interval and the set "
          "interval at the picked z, on the same studies (in brackets: estimates outside their own interval)")
    print("| claim | interval | " + " | ".join(f"{n} {d}" for n in names for d in COUNTS)
          + " | range at 16-32 | at 8 | uncertain (coverage + 2 SE < 0.90 at 16-32) | 64: " + ", ".join(names) + " |")
    print("|---|---|" + "---|" * (len(names) * len(COUNTS)) + "---|---|---|---|")
    cells: dict[tuple[str, int], dict] = {}
    for name in names:
        for documents in (*COUNTS, GROUPED_DOCUMENTS):
            wanted = keys if documents != GROUPED_DOCUMENTS else tuple(k for k in keys if k == "stable_norms")
            if not wanted:
                continue
            cells[name, documents] = _timed(
                f"set intervals held out {name}, {documents} documents",
                lambda: coverage(populations[name], documents, held_out_studies,
                                 {"set": {k: chosen_set[k] for k in wanted}}),
            )
    for key in keys:
        for label, choice in (("current", "chosen"), (f"set, z = {chosen_set[key].per_head_z:g}", "set")):
            row = [cells[n, d][choice][key] for n in names for d in COUNTS]
            wide = [cells[n, d][choice][key] for n in names for d in (16, 32)]
            eight = [share(cells[n, 8][choice][key]) for n in names]
            grouped = ", ".join(f"{share(cells[n, GROUPED_DOCUMENTS][choice][key]):.2f}"
                                for n in names if (n, GROUPED_DOCUMENTS) in cells and key == "stable_norms") or "-"
            text = " | ".join(f"{share(c):.2f}" + (f" ({c[2]})" if c[2] else "") for c in row)
            print(f"| {key} | {label} | {text} | {min(map(share, wide)):.2f}-{max(map(share, wide)):.2f} | "
                  f"{min(eight):.2f}-{max(eight):.2f} | {'yes' if uncertain(wide) else 'no'} | {grouped} |")
    print("\nAdoption (the rule written before the run):")
    for key in keys:
        wide = {choice: [cells[n, d][choice][key] for n in names for d in (16, 32)] for choice in ("chosen", "set")}
        print(f"- {key}, z = {chosen_set[key].per_head_z:g}: {adopted(wide['set'], wide['chosen'])}")
    others = [key for key in COVERED if key not in keys]
    print("\nThe other claims' own intervals on the same studies (an observation: "
          f"{held_out_studies} studies per cell)")
    print("| claim | " + " | ".join(f"{n} {d}" for n in names for d in COUNTS) + " | range at 16-32 |")
    print("|---|" + "---|" * (len(names) * len(COUNTS)) + "---|")
    for key in others:
        row = [cells[n, d]["chosen"][key] for n in names for d in COUNTS]
        wide = [share(cells[n, d]["chosen"][key]) for n in names for d in (16, 32)]
        text = " | ".join(f"{share(c):.2f}" + (f" ({c[2]})" if c[2] else "") for c in row)
        print(f"| {key} | {text} | {min(wide):.2f}-{max(wide):.2f} |")


def adopted(picked: list[tuple[int, int, int]], current: list[tuple[int, int, int]]) -> str:
    """The adoption rule (docs/claims.md, "Set intervals"), from the cells at 16-32 documents of the picked z's set
    interval and of the current interval on the same studies."""
    low, high, before = min(map(share, picked)), max(map(share, picked)), min(map(share, current))
    if not uncertain(picked):
        return f"adopted, no longer uncertain ({low:.2f}-{high:.2f})"
    if low > before:
        return f"adopted, still uncertain ({low:.2f}-{high:.2f}; the current interval's lowest {before:.2f})"
    return f"not adopted: uncertain and its lowest cell {low:.2f} not above the current's {before:.2f}"


def near_line_candidates() -> dict[str, dict]:
    """The candidates of the rule (docs/claims.md, "Why two intervals miss on near and noisy"), by claim: for large-N
    return every method at either level (nominal 95 %), for the reading within sequences its declared interval
    (basic, expanded, 99 %) joined with the set interval at each z of ``AT_THRESHOLD_ZS``."""
    return {"large_n_return": every_choice(("large_n_return",)),
            "stable_norms_within": set_choices(("stable_norms_within",), AT_THRESHOLD_ZS)}


def near_line_tables(tuning_studies: int, held_out_studies: int) -> None:
    """The rule's run: `pick` on ``NEAR_TUNING`` at ``TUNING_DOCUMENTS`` documents (``tuning_studies`` studies), then
    the picked choice beside the current one on ``NEAR_FRESH`` (new) and the seen populations at ``COUNTS``."""
    candidates = near_line_candidates()
    merged = {name: choice for by_name in candidates.values() for name, choice in by_name.items()}
    found = _timed("near lines, tuning", lambda: coverage(NEAR_TUNING, TUNING_DOCUMENTS, tuning_studies, merged))
    picked = {key: pick(found, key) for key in candidates}
    print(f"\nTuning (NEAR_TUNING, seed {NEAR_TUNING.seed}, {TUNING_DOCUMENTS} documents, {tuning_studies} studies)")
    for key, by_name in candidates.items():
        cells = ", ".join(f"{name} {share(found[name][key]):.3f}" for name in by_name)
        print(f"- {key}: current {share(found['chosen'][key]):.3f}; {cells}; the rule's pick: {picked[key]}")
    choice = {"picked": {key: candidates[key][picked[key]][key] for key in candidates}}
    populations = {**NEAR_FRESH, **TRADEOFF_FRESH, **FRESH, **HELD_OUT}
    cells = _cells("near lines held out", populations, held_out_studies, choice)
    names, new = list(populations), list(NEAR_FRESH)
    print(f"\nHeld out ({held_out_studies} studies per cell; in brackets estimates outside their own interval)")
    print("| claim | interval | " + " | ".join(f"{n} {d}" for n in names for d in COUNTS)
          + " | 16-32, new fresh | 16-32, all | 8 | uncertain |")
    print("|---|---|" + "---|" * (len(names) * len(COUNTS)) + "---|---|---|---|")
    for key in candidates:
        for label, which in (("current", "chosen"), (picked[key], "picked")):
            row = [cells[n, d][which][key] for n in names for d in COUNTS]
            wide = [cells[n, d][which][key] for n in names for d in (16, 32)]
            fresh = [share(cells[n, d][which][key]) for n in new for d in (16, 32)]
            eight = [share(cells[n, 8][which][key]) for n in names]
            text = " | ".join(f"{share(c):.2f}" + (f" ({c[2]})" if c[2] else "") for c in row)
            print(f"| {key} | {label} | {text} | {min(fresh):.2f}-{max(fresh):.2f} | "
                  f"{min(map(share, wide)):.2f}-{max(map(share, wide)):.2f} | {min(eight):.2f}-{max(eight):.2f} | "
                  f"{'yes' if uncertain(wide) else 'no'} |")
    print("\nAdoption (the rule written before the run):")
    for key in candidates:
        wide = {w: [cells[n, d][w][key] for n in names for d in (16, 32)] for w in ("chosen", "picked")}
        print(f"- {key}, {picked[key]}: {adopted(wide['picked'], wide['chosen'])}")


def _rise(means: np.ndarray) -> np.ndarray:
    """The U-shape's return of per-head curves ``[*b, layer, head, n]``, from the claim's words: the mean over heads
    at large N minus at mid N ``[*b]``."""
    with np.errstate(invalid="ignore"), warnings.catch_warnings():  # a replicate whose weights leave no document: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        curve = np.nanmean(means.reshape(*means.shape[:-3], -1, means.shape[-1]), axis=-2)
    return curve[..., LARGE].mean(-1) - curve[..., MID].mean(-1)


def diagnosed_table(studies: int) -> None:
    """Per cell of ``DIAGNOSED``, ``studies`` seeded studies (the coverage study's own: the same seeds): for large-N
    return, the bias and spread of its estimate, where its interval misses, and each metric's rise on its own (the
    statistic is the smaller of the two); for the reading within sequences, the same against the truth (the hard
    share of heads with CV <= 0.05 on the true means) and against the value its statistic (the expected share)
    takes on the true means with the true standard errors of the cell's document count."""
    jaxtyping.config.jaxtyping_disable = True  # the package's own tests check the shapes; here, speed
    torch.set_num_threads(1)
    populations = {**TRADEOFF_FRESH, **FRESH, **HELD_OUT}
    normal = NormalDist()
    print(f"\nWhy two intervals miss ({studies} studies per cell, the coverage study's seeds)")
    print("| cell | truth: rise of P, R | estimate's bias (its sd) | a minimum's expected bias | covers | below / above the truth "
          "| each rise's own percentile interval covers P, R | replicates' mean - estimate |")
    print("|---|---|---|---|---|---|---|---|")
    within_rows = []
    for name, documents in DIAGNOSED:
        population = populations[name]
        means = true_means(population)
        truth = true_values(means, documents, population)
        rng = np.random.default_rng((population.seed, documents))  # as `coverage` seeds its studies
        start = time.perf_counter()
        rows, within = [], []
        true_rise = (_rise(means["precision"]), _rise(means["recall"]))
        for _ in range(studies):
            result = simulate_study(means, rng, documents, population)
            table = claims(result)
            value, low, high = estimate(table, "large_n_return")
            parts, replicated = [], []
            for metric, t in zip(("precision", "recall"), true_rise, strict=True):
                replicates = _rise(result.replicates(metric).double().numpy())
                lo, hi = np.nanquantile(replicates, (0.025, 0.975))
                parts += [lo <= t <= hi, math.nan]
                replicated.append(replicates)
            parts[-1] = float(np.nanmean(np.minimum(*replicated)))  # the replicates' statistic, the smaller rise
            own = [_rise(result.per_head(metric).double().numpy()) for metric in ("precision", "recall")]
            rows.append((value, low, high, *parts, *own))
            cv = result.per_head("value_norm_cv").double().numpy().ravel()
            within.append((*estimate(table, "stable_norms_within"), float((cv <= 0.05).mean())))
        print(f"diagnosed {name}, {documents} documents: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        a = np.array(rows, dtype=float)
        t = truth["large_n_return"]
        value, low, high = a[:, 0], a[:, 1], a[:, 2]
        rep_bias = np.nanmean(a[:, 6] - value)
        # the bias a minimum of two unbiased normal estimates has (Clark 1961): -theta phi(d / theta) + ..., theta
        # from the two rises' spreads over the studies, d the truths' gap
        theta = math.hypot(a[:, 7].std(), a[:, 8].std())
        gap = true_rise[0] - true_rise[1]
        expected = (true_rise[0] * normal.cdf(-gap / theta) + true_rise[1] * normal.cdf(gap / theta)
                    - theta * math.exp(-((gap / theta) ** 2) / 2) / math.sqrt(2 * math.pi) - t)
        print(f"| {name} {documents} | {true_rise[0]:.4f}, {true_rise[1]:.4f} | {value.mean() - t:+.4f} "
              f"({value.std():.4f}) | {expected:+.4f} | {np.mean((low <= t) & (t <= high)):.2f} | {np.mean(high < t):.2f} / "
              f"{np.mean(low > t):.2f} | {a[:, 3].mean():.2f}, {a[:, 5].mean():.2f} | {rep_bias:+.4f} |")
        cv_true = means["value_norm_cv"].ravel()
        se_true = cv_true / math.sqrt(population.positive_shape * documents)  # a mean of gamma draws of this shape
        target = float(np.mean([normal.cdf((0.05 - c) / s) for c, s in zip(cv_true, se_true, strict=True)]))
        w = np.array(within, dtype=float)
        z = (cv_true - 0.05) / se_true
        within_rows.append(
            f"| {name} {documents} | {truth['stable_norms_within']:.3f} | {target:.3f} | "
            f"{', '.join(f'{x:+.1f}' for x in np.sort(z[abs(z) < 1.5]))} | {w[:, 0].mean() - truth['stable_norms_within']:+.3f} "
            f"({w[:, 0].std():.3f}) | {w[:, 3].mean() - truth['stable_norms_within']:+.3f} | "
            f"{np.mean((w[:, 1] <= truth['stable_norms_within']) & (truth['stable_norms_within'] <= w[:, 2])):.2f} | "
            f"{np.mean(w[:, 2] < truth['stable_norms_within']):.2f} / {np.mean(w[:, 1] > truth['stable_norms_within']):.2f} | "
            f"{np.mean((w[:, 1] <= target) & (target <= w[:, 2])):.2f} | {np.mean(w[:, 2] - w[:, 1]):.3f} |")
    print("\n| cell | truth (hard share) | expected share on the true means, true se | heads within 1.5 se of 0.05 "
          "(z) | estimate's bias (its sd) | hard share of the estimates: bias | covers the truth | below / above "
          "| covers the expected share's own target | width |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(within_rows))


MODES = ("--tuning-only", "--held-out-only", "--grouped-only", "--remeasure", "--diagnose", "--near-lines", "--status",
         "--tied", "--at-64", "--over-coverage", "--one-sided", "--above", "--band", "--set-intervals",
         "--at-thresholds", "--tradeoffs", "--thirteen")

if __name__ == "__main__":
    unknown = [a for a in sys.argv[1:] if a.startswith("-") and a not in MODES
               and not a.startswith(("--claim=", "--population="))]
    if unknown:
        sys.exit(f"bench_coverage.py: unknown option {' '.join(unknown)}; the options: {' '.join(MODES)}, "
                 "--claim=KEY, --population=NAME, and a number of studies (see the module's docstring)")
    arguments = [a for a in sys.argv[1:] if not a.startswith("--")]
    count = int(arguments[0]) if arguments else STUDIES
    populations = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--population=")] or list(HELD_OUT)
    if "--tradeoffs" in sys.argv:  # the new fresh populations, then the seen ones
        set_interval_tables(SET_TUNING_STUDIES, count if arguments else SET_HELD_OUT_STUDIES, ("role_tradeoffs",),
                            [*TRADEOFF_FRESH, *FRESH, *HELD_OUT], THRESHOLD_TUNING, AT_THRESHOLD_ZS,
                            {**TRADEOFF_FRESH, **FRESH, **HELD_OUT})
        sys.exit()
    if "--at-thresholds" in sys.argv:  # the fresh populations, then the seen ones
        claims_ = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--claim=")] or list(SET_CLAIMS)
        set_interval_tables(SET_TUNING_STUDIES, count if arguments else SET_HELD_OUT_STUDIES, tuple(claims_),
                            [*FRESH, *HELD_OUT], THRESHOLD_TUNING, AT_THRESHOLD_ZS, {**FRESH, **HELD_OUT})
        sys.exit()
    if "--set-intervals" in sys.argv:
        claims_ = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--claim=")] or list(SET_CLAIMS)
        set_interval_tables(SET_TUNING_STUDIES, count if arguments else SET_HELD_OUT_STUDIES, tuple(claims_),
                            populations)
        sys.exit()
    if "--grouped-only" in sys.argv:
        grouped_table(count, populations)
        sys.exit()
    if "--near-lines" in sys.argv:
        near_line_tables(SET_TUNING_STUDIES, count if arguments else SET_HELD_OUT_STUDIES)
        sys.exit()
    if "--diagnose" in sys.argv:
        diagnosed_table(count if arguments else SET_HELD_OUT_STUDIES)
        sys.exit()
    if "--status" in sys.argv:
        status_tables(count if arguments else SET_HELD_OUT_STUDIES, REMEASURE_STUDIES,
                      THIRTEEN if "--thirteen" in sys.argv else ALL_HELD_OUT)
        sys.exit()
    if "--over-coverage" in sys.argv:
        over_coverage_table(count if arguments else SET_HELD_OUT_STUDIES)
        sys.exit()
    if "--one-sided" in sys.argv:
        one_sided_tables(SET_TUNING_STUDIES, count if arguments else SET_HELD_OUT_STUDIES, REMEASURE_STUDIES)
        sys.exit()
    if "--above" in sys.argv or "--band" in sys.argv:
        over_covering = above_tables(count if arguments else SET_HELD_OUT_STUDIES, REMEASURE_STUDIES)
        if "--band" in sys.argv:
            band_tables(count if arguments else SET_HELD_OUT_STUDIES, REMEASURE_STUDIES, over_covering)
        sys.exit()
    if "--tied" in sys.argv:
        tied_table(count if arguments else SET_HELD_OUT_STUDIES)
        sys.exit()
    if "--at-64" in sys.argv:
        at_64_table(count if arguments else SET_HELD_OUT_STUDIES)
        sys.exit()
    if "--remeasure" in sys.argv:
        remeasured_table(int(arguments[0]) if arguments else REMEASURE_STUDIES)
        sys.exit()
    if "--held-out-only" not in sys.argv:
        tuning_table(count)
    if "--tuning-only" not in sys.argv:
        held_out_table(count, populations)
