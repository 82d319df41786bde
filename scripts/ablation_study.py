"""Roles against the model's needs, and beside published measures: the Markdown of docs/circuits.md's last section.

For one bundled model (argument: smollm2-135m or gemma3-270m), prints

1. the head roles (``tg.classify_heads``) on the first W windows of C tokens of the default text;
2. ``tl_geometry.interventions.ablate_roles``: zero- and mean-ablation of every role class, sub-type and detector group on
   those windows (mean z from the next W windows) and on repeated random tokens, against random head
   sets of the same size and layer distribution;
3. Gu et al.'s first-token sink rate and the dormant share by output norm (``tl_geometry.interventions.published_measures``) on
   S sequences of 64 tokens, cross-tabulated with the roles.

Usage: PYTHONPATH=. python scripts/ablation_study.py [MODEL] [--windows 8] [--context 256] [--random 8] [--min-heads 1]
"""

import argparse
import dataclasses
import time

import torch

import tl_geometry as tg
from tl_geometry.interventions import ablate_roles, published_measures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--role-windows", type=int, default=8, help="windows the roles are classified on")
    parser.add_argument("--role-context", type=int, default=256)
    parser.add_argument("--no-uncertain", action="store_true", help="do not ablate the 'uncertain' heads as a group")
    parser.add_argument("--random", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--period", type=int, default=64)
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument("--min-heads", type=int, default=1, help="smallest sub-type or detector group ablated")
    parser.add_argument("--thresholds", default="0.1,0.2,0.3", help="dormant thresholds to tabulate")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.time()
    model = tg.load_model(args.model, progress=False)
    windows = tg.text_windows(model, tg.default_text(), context=args.role_context, n_windows=args.role_windows)
    roles = tg.classify_heads(model, windows)
    names = roles.label_names()
    n_heads = len(roles.layers) * len(roles.heads)
    counts = {label: sum(row.count(label) for row in names) for label in ("retriever", "mixer", "reset", "content", "uncertain")}
    print(f"### {args.model}\n")
    print(f"Roles on {args.role_windows} windows x {args.role_context} tokens of the default text ({n_heads} heads): "
          + ", ".join(f"{k} {v}" for k, v in counts.items()) + ".\n")
    result = ablate_roles(model, roles, n_windows=args.windows, context=args.context, mean_windows=args.windows,
                             n_random=args.random, repeated_prompts=args.prompts, period=args.period, min_heads=args.min_heads,
                             uncertain=not args.no_uncertain,
                             batch_size=args.batch_size, progress=True)
    s = result.settings
    print(f"Ablations: {s['windows']} evaluated windows x {s['context']} tokens (mean z from the next "
          f"{s['mean_windows']} windows); {s['repeated_prompts']} repeated prompts of BOS + 2 x {s['period']} random "
          f"tokens; {s['n_random']} random head sets per group; {s['n_bootstrap']} bootstrap replicates over "
          f"documents; seed {s['seed']}. Clean NLL: "
          + ", ".join(sorted({f'{r.task} {r.clean:.3f}' for r in result.rows})) + " nats.\n")
    print(result.to_markdown())
    print()
    label_of = {(layer, head): names[i][j] for i, layer in enumerate(roles.layers)
                for j, head in enumerate(roles.heads)}
    for group in result.groups:
        if group.kind != "role":
            labels = [label_of[head] for head in group.heads]
            mix = ", ".join(f"{label} {labels.count(label)}" for label in dict.fromkeys(sorted(labels)))
            listed = (": " + ", ".join(f"{l}.{h}" for l, h in group.heads)) if len(group.heads) <= 12 else ""
            print(f"- {group.name} ({mix}){listed}")
    print()
    thresholds = [float(t) for t in args.thresholds.split(",")]
    measures = published_measures(model, n_sequences=args.sequences, length=64, batch_size=args.batch_size)
    table = measures.crosstab(roles)
    print(f"First-token sink rate (Gu et al., epsilon = {measures.epsilon}, {measures.sequences} sequences x "
          f"{measures.length} tokens): {100 * measures.sink_rate:.1f} % of (sequence, layer, head); "
          f"{int(measures.sink_heads.sum())} of {n_heads} heads have a mean first-token score above epsilon. Output "
          f"norms (before W_O) against the layer's mean: smallest ratio {float(measures.norm_ratio.min()):.3f} "
          f"(head {divmod(int(measures.norm_ratio.argmin()), len(roles.heads))}), 5th percentile "
          f"{float(measures.norm_ratio.flatten().quantile(0.05)):.3f}.\n")
    labels = list(table["all"])
    header = "| heads | " + " | ".join(labels) + " | total |"
    print(header + "\n|---|" + "---:|" * (len(labels) + 1))
    rows = [("all", table["all"]), (f"sink (score > {measures.epsilon})", table["sink"])]
    for t in thresholds:
        m = dataclasses.replace(measures, dormant_threshold=t)  # the norms are measured once
        rows.append((f"dormant (norm < {t:g} x layer mean)", m.crosstab(roles)["dormant"]))
    for name, row in rows:
        print(f"| {name} | " + " | ".join(str(row[k]) for k in labels) + f" | {sum(row.values())} |")
    print(f"\n({time.time() - start:.0f} s on this machine)")


if __name__ == "__main__":
    main()
