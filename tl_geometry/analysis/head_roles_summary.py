"""The short summary a `HeadRoles` prints and shows in a notebook (its ``__repr__`` and ``_repr_html_``).

Kept out of `tl_geometry.analysis.head_roles` (the rules) so that the summary
can change without touching them.
"""

from typing import Any

import torch

from tl_geometry._renamed import old_names
from tl_geometry.results.display import Summary, plural, ranges, short_list


def roles_summary(roles: Any) -> Summary:
    """Heads per label, the most and least certain heads, and what to call next, in at most 25 lines."""
    from tl_geometry.analysis.head_roles import ROLE_LABELS, UNCERTAIN

    labels = roles.labels
    counts = torch.bincount(labels.flatten(), minlength=len(ROLE_LABELS)).tolist()
    n_layers, n_heads = len(roles.layers), len(roles.heads)
    rows = [
        ("heads", f"{plural(n_layers, 'layer')} x {plural(n_heads, 'head')} (layers {ranges(roles.layers)}; "
                  f"heads {ranges(roles.heads)})"),
        ("N grid", f"{plural(len(roles.n_grid), 'value')}: {short_list(roles.n_grid.tolist())}"),
        ("labels", ", ".join(f"{plural(c, ROLE_LABELS[k] + ' head')}" for k, c in enumerate(counts) if c)),
    ]
    # The surest head of each named label, so that a reader has one to look at per role.
    margin = roles.margin.nan_to_num(-1.0)
    examples = []
    for k, role in enumerate(ROLE_LABELS):
        if k == UNCERTAIN or not counts[k]:
            continue
        flat = torch.where(labels.flatten() == k, margin.flatten(), -2.0).argmax()
        i, j = divmod(int(flat), n_heads)
        examples.append(f"{role} {roles.layers[i]}.{roles.heads[j]} (margin {float(margin[i, j]):.2f})")
    if examples:
        rows.append(("surest", "; ".join(examples)))
    rows.append(("features", f"{len(roles.features)} role features (roles.features), "
                             "precision and recall [layer, head, n]"))
    layer, head = roles.layers[0], roles.heads[0]
    rows += [
        ("read", f"roles.describe({layer}, {head}); roles.table() (one row per head); "
                 "roles.counts_by_layer()"),
        ("next", "roles.curves_by_role('precision'); the report's head-roles section"),
    ]
    return Summary("HeadRoles", tuple(rows))

__getattr__ = old_names(__name__, globals())  # the names they had before (tl_geometry._renamed)
