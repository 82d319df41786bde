"""Whether the roles' z thresholds stay inside the bootstrap replicates, decided on saved tuning runs.

The rule (docs/circuits.md, "A z test inside the replicates", written before
its run): candidates (``z_align``, ``z_shift``) = (2, 2), (1, 1) and (0, 0);
on four saved roles results of disjoint groups of windows, the halves'
agreement as the mean over the three ways of pairing the groups into halves,
and the uncertain share of the four groups merged. A candidate replaces (2, 2)
when its mean agreement is higher and its uncertain share at most one point
higher; of several, the highest agreement, a tie going to the larger z.

    PYTHONPATH=. python scripts/role_z_choice.py DIR PREFIX

reads DIR/PREFIX-group1 .. -group4, e.g. the runs of
``scripts/query_sample_choice.py --sizes 8 --first 16 --save DIR`` (PREFIX
``q8``: the tuning windows 17-32) or of ``STUDY_SAVE=DIR scripts/role_study.py``
(PREFIX the model's name). No model runs: the roles are read from the results.
"""

import argparse
from pathlib import Path

import tl_geometry as tg
from tl_geometry.analysis.head_roles import ROLE_LABELS, UNCERTAIN, RoleConfig, agreement, roles_from_result

CANDIDATES = (2.0, 1.0, 0.0)  # z_align = z_shift; the first is today's default
PAIRINGS = (((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2)))
UNCERTAIN_SLACK = 0.01


def measure(groups: list[tg.GeometryResult], z: float) -> dict:
    """Halves agreement per pairing, its mean, and the merge's uncertain share and role counts, at one z."""
    config = RoleConfig(z_align=z, z_shift=z)
    halves = [agreement(*(roles_from_result(tg.GeometryResult.merge([groups[i] for i in half]), config)
                          for half in pairing)) for pairing in PAIRINGS]  # fmt: skip
    labels = roles_from_result(tg.GeometryResult.merge(groups), config).labels
    return {"z": z, "halves": halves, "mean": sum(share for share, _ in halves) / len(halves),
            "uncertain": float((labels == UNCERTAIN).double().mean()),
            "counts": [int((labels == i).sum()) for i in range(len(ROLE_LABELS))], "heads": labels.numel()}  # fmt: skip


def pick(rows: list[dict]) -> float:
    """The rule: a candidate beats today's (the first row) by agreement within the slack of uncertain share."""
    today = rows[0]
    better = [row for row in rows[1:] if row["mean"] > today["mean"] and row["uncertain"] <= today["uncertain"] + UNCERTAIN_SLACK]
    if not better:
        return today["z"]
    return max(better, key=lambda row: (row["mean"], row["z"]))["z"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("prefix")
    args = parser.parse_args()
    groups = [tg.GeometryResult.load(args.directory / f"{args.prefix}-group{i}") for i in range(1, 5)]
    rows = [measure(groups, z) for z in CANDIDATES]
    print("| z_align, z_shift | halves agree (three pairings) | mean | uncertain | " + " / ".join(ROLE_LABELS[:-1]) + " |")
    print("|---|---|---|---|---|")
    for row in rows:
        halves = ", ".join(f"{100 * share:.1f} % of {both}" for share, both in row["halves"])
        uncertain = row["counts"][UNCERTAIN]
        print(f"| {row['z']:g}, {row['z']:g} | {halves} | {100 * row['mean']:.2f} % | {uncertain} of {row['heads']} "
              f"({100 * row['uncertain']:.1f} %) | {' / '.join(str(c) for c in row['counts'][:UNCERTAIN])} |")
    print(f"\nthe rule's pick: z = {pick(rows):g}")


if __name__ == "__main__":
    main()
