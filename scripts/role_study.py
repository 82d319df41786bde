"""The figures of the head roles (docs/circuits.md), printed as Markdown for the bundled models.

Run from the repository root (a few minutes per model on a 2-core CPU; Gemma-3-270M
needs its package and about 6 GB):

    PYTHONPATH=. python scripts/role_study.py [smollm2-135m] [gemma3-270m] [--windows 16] [--context 1024]

For each model, on the report's default input (``--windows`` windows of
``--context`` tokens of the bundled text) with the ``"roles"`` diagnostic
and its default query sample:

- the labels: counts by role, the share of "uncertain" heads, and that every
  head has a role or "uncertain";
- the paper's rules read literally beside ours (counts, and the cross-tab);
- the sub-types: counts by kind, the uncertain ones, and their agreement
  across four disjoint groups of the windows;
- stability: the roles of the first and the second half of the windows,
  analysed separately, agree on the heads both label; the default sample and
  a sample with another seed agree;
- the known mechanisms (`tl_geometry.roles.check_known_mechanisms`):
  the ten heads with the highest previous-token score on natural text, the
  ten with the highest induction score on repeated random tokens, and the ten
  with the highest duplicate-token and BOS scores on natural text, and their
  roles (recall); of the heads named previous-token or lag T - 1, how many
  the detector confirms (score >= 0.3; precision);
- the threshold sensitivity (+-10 % on each threshold);
- Gaussian mixtures over the per-head features for k = 1..6 and their BIC.

``STUDY_SAVE=DIR`` keeps the results (DIR/<model>-group1 to -group4 and -seed1); ``--no-reseed`` leaves the
second query sample out.
"""

import argparse
import os
from pathlib import Path

import torch

import tl_geometry as tg
from tl_geometry.analysis.mixture import MIXTURE_FEATURES, mixture_bic, role_feature_matrix
from tl_geometry.analysis.head_roles import (
    LITERAL_ROLES,
    ROLE_LABELS,
    UNCERTAIN,
    agreement,
    role_counts,
    subtype_agreement,
    roles_from_result,
    threshold_sensitivity,
)
from tl_geometry.roles.prompt_sets import check_known_mechanisms


def _analyse(model, windows, config, save: str | None, tag: str):
    result = tg.analyze_corpus(model, windows, config, batch_size=1, progress=True)
    if save:
        result.save(Path(save) / tag)
    return result


def study(name: str, n_windows: int, context: int, reseed: bool = True) -> None:
    save = os.environ.get("STUDY_SAVE")
    model = tg.load_model(name, progress=False)
    windows = tg.text_windows(model, tg.default_text(), context=context, n_windows=n_windows)
    config = tg.GeometryConfig(diagnostics=["roles"])
    half, quarter = n_windows // 2, n_windows // 4
    groups = [_analyse(model, windows[i * quarter : (i + 1) * quarter], config, save, f"{name}-group{i + 1}") for i in range(4)]
    first, second = tg.GeometryResult.merge(groups[:2]), tg.GeometryResult.merge(groups[2:])
    full = tg.GeometryResult.merge(groups)
    reseeded = (_analyse(model, windows, config.with_overrides(settings={"roles": {"seed": 1}}), save, f"{name}-seed1")
                if reseed else None)
    roles = roles_from_result(full)
    n_heads = roles.labels.numel()
    counts = role_counts(roles)
    print(f"\n### {name}: {n_windows} windows of {context} tokens, {n_heads} heads\n")
    print("| " + " | ".join(ROLE_LABELS) + " |\n|" + "---|" * len(ROLE_LABELS))
    print("| " + " | ".join(str(counts[r]) for r in ROLE_LABELS) + " |\n")
    print(f"- uncertain: {counts['uncertain']} of {n_heads} ({100 * counts['uncertain'] / n_heads:.1f} %); "
          f"heads without a role or 'uncertain': {int(((roles.labels < 0) | (roles.labels > UNCERTAIN)).sum())}")
    share, both = agreement(roles_from_result(first), roles_from_result(second))
    print(f"- halves: windows 1-{half} and {half + 1}-{n_windows} agree on {100 * share:.1f} % of the {both} heads both label")
    if reseeded is not None:
        share, both = agreement(roles, roles_from_result(reseeded))
        print(f"- query sample: seed 0 and seed 1 agree on {100 * share:.1f} % of the {both} heads both label")
    literal = [n for row in roles.literal_names() for n in row]
    ours = [n for row in roles.label_names() for n in row]
    print("\nThe paper's rules read literally (norms, raw cosines) against ours: rows ours, columns literal\n")
    print("| ours | " + " | ".join(LITERAL_ROLES) + " |\n|" + "---|" * (len(LITERAL_ROLES) + 1))
    for label in ROLE_LABELS:
        print(f"| {label} | " + " | ".join(str(sum(o == label and t == lit for o, t in zip(ours, literal))) for lit in LITERAL_ROLES) + " |")
    print(f"\n- Mixers: {ours.count('mixer')} ours, {literal.count('mixer')} read literally")
    subs = [roles.subtype(layer, head) for layer in roles.layers for head in roles.heads]
    kinds = {"previous-token": sum(s == "previous-token" for s in subs),
             "lag k > 1": sum(s is not None and s.startswith("lag") for s in subs),
             "secondary sink": sum(s is not None and s.startswith("secondary sink") for s in subs)}  # fmt: skip
    print("- sub-types: " + ", ".join(f"{k} {v}" for k, v in kinds.items()))
    sub = subtype_agreement([roles_from_result(g) for g in groups])
    print(f"- sub-types across four disjoint groups of {quarter} windows (six pairs): the same in {sub.same_both} of "
          f"{sub.both} (head, pair)s where both name one, {sub.same_sure} of {sub.sure} where either names one and "
          f"neither is uncertain (the rule's count), {sub.same_either} of {sub.either} where either names one; "
          f"uncertain sub-types per group: {', '.join(map(str, sub.uncertain))}; on the whole input: "
          f"{sum(roles.subtype_uncertain(layer, head) is not None for layer in roles.layers for head in roles.heads)}")
    probability = roles.probabilities.amax(-1)
    print(f"- probability of the label: median {float(probability.median()):.2f}; "
          f"margin p1 - p2 below {roles.config.margin} for {int((roles.margin < roles.config.margin).sum())} heads")

    checks = check_known_mechanisms(model, n_prompts=8)  # the docs' tables: 8 prompts per set (the report runs 4)
    sets = (("previous_token", "natural"), ("induction", "repeated"), ("duplicate_token", "natural"), ("bos", "natural"))
    for detector, set_name in sets:
        check = checks[set_name]
        expected = (f" ({check.matches(detector)} of 10 placed as expected on these prompts)"
                    if detector in ("previous_token", "induction") else "")
        print(f"\n{detector} score on the {set_name} prompts: the top ten heads{expected}\n")
        print("| head | score | role on these prompts | sub-type | p(content) | role on the default input |\n|---|---|---|---|---|---|")
        for row in check.cross_tab(detector):
            layer, head = row["layer"], row["head"]
            default = roles.label_names()[roles.layers.index(layer)][roles.heads.index(head)]
            sub = roles.subtype(layer, head)
            print(f"| {layer}.{head} | {row['score']:.2f} | {row['label']} | {row['subtype'] or '-'} | "
                  f"{row['p_content']:.2f} | {default}{f' ({sub})' if sub else ''} |")
        if detector in ("previous_token", "induction"):
            top = check.top_heads(detector)
            want = "previous-token" if detector == "previous_token" else f"lag {check.period - 1}"
            on_default = sum(roles.subtype(layer, head) == want for layer, head in top)
            print(f"\nRecall on the default input: {on_default} of 10 are named {want}.")
            for where, named in (("these prompts", check.roles), ("the default input", roles)):
                found = check.agreement(detector, named)
                print(f"Precision on {where}: {len(found.confirmed)} of the {len(found.named)} heads named {want} "
                      f"score >= {found.threshold} ({', '.join(f'{l}.{h}' for l, h in found.named)}); "
                      f"recall: {len(found.confirmed)} of the {len(found.detected)} heads scoring >= {found.threshold} "
                      f"({', '.join(f'{l}.{h}' for l, h in found.detected)})")

    print("\nMean detector score by role on the default input's labels (natural prompts; repeated for induction)\n")
    print("| role | heads | previous-token | duplicate-token | induction | BOS |\n|---|---|---|---|---|---|")
    for index, role in enumerate(ROLE_LABELS):
        member = roles.labels == index
        if not bool(member.any()):
            continue
        scores = [checks["natural"].scores[d][member].mean() for d in ("previous_token", "duplicate_token")]
        scores += [checks["repeated"].scores["induction"][member].mean(), checks["natural"].scores["bos"][member].mean()]
        print(f"| {role} | {int(member.sum())} | " + " | ".join(f"{float(s):.2f}" for s in scores) + " |")

    print("\nThreshold sensitivity (labels changed when one threshold moves by 10 %)\n")
    print("| threshold | moved to | labels changed | " + ", ".join(ROLE_LABELS) + " |\n|---|---|---|---|")
    for row in threshold_sensitivity(full):
        print(f"| {row.threshold} | {row.value:.3g} | {row.changed} | {', '.join(map(str, row.counts))} |")

    fits = mixture_bic(role_feature_matrix(roles.features))
    best = min(fits, key=lambda f: f.bic)
    print(f"\nGaussian mixtures over {', '.join(MIXTURE_FEATURES)} (standardised): BIC by k; best k = {best.k}\n")
    print("| k | log-likelihood | parameters | BIC | BIC - best |\n|---|---|---|---|---|")
    for fit in fits:
        print(f"| {fit.k} | {fit.log_likelihood:.1f} | {fit.n_parameters} | {fit.bic:.1f} | {fit.bic - best.bic:.1f} |")
    sizes = torch.bincount(best.assignment, minlength=best.k).tolist()
    print(f"\nComponent sizes at k = {best.k}: {sizes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--no-reseed", action="store_true", help="leave out the second query sample (seed 1)")
    args = parser.parse_args()
    for name in args.models:
        study(name, args.windows, args.context, reseed=not args.no_reseed)


if __name__ == "__main__":
    main()
