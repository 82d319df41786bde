"""Slow, obviously-correct reference implementations written from the paper's definitions.

float64, one row and one N at a time, distances computed directly as
||s - y_i|| (or the cosine distance). The fast engine is compared against these.
"""

import math

import torch


def reference_order(alpha: torch.Tensor, values: torch.Tensor, visible: list[int], ranking: str) -> list[int]:
    """Visible keys by decreasing score, ties broken by increasing key index."""
    score = {i: float(alpha[i]) * (float(values[i].norm()) if ranking == "contribution" else 1.0) for i in visible}
    return sorted(visible, key=lambda i: (-score[i], i))


def reference_distance(s: torch.Tensor, y: torch.Tensor, distance: str) -> float:
    if distance == "euclidean":
        return float((s - y).norm())
    return 1.0 - float(s @ y) / (float(s.norm()) * float(y.norm()) + 1e-12)


def reference_row(alpha, values, mask, n, ranking="attention", distance="euclidean") -> dict[str, float]:
    """Every metric of one query row at one selection size N."""
    alpha, values = alpha.double(), values.double()
    visible = [i for i in range(len(alpha)) if bool(mask[i])]
    if n > len(visible):
        return dict.fromkeys(
            ("precision", "recall", "f_rmax", "f_rmin", "f_score", "r_min", "r_max", "s_norm", "k_out", "k_in"),
            math.nan,
        )
    order = reference_order(alpha, values, visible, ranking)
    selected, rest = order[:n], order[n:]
    y = {i: alpha[i] * values[i] for i in visible}
    s = sum((y[i] for i in selected), torch.zeros(values.shape[-1], dtype=torch.float64))
    dist = {i: reference_distance(s, y[i], distance) for i in visible}
    r_max = max(dist[i] for i in selected)
    r_min = min((dist[j] for j in rest), default=math.inf)
    k_out = sum(1 for j in rest if dist[j] <= r_max)
    k_in = sum(1 for i in selected if dist[i] < r_min)
    p, r = n / (n + k_out), k_in / n
    return {
        "precision": p,
        "recall": r,
        "f_rmax": 2 * p / (1 + p),
        "f_rmin": 2 * r / (1 + r),
        "f_score": 2 * p * r / (p + r),
        "r_min": r_min,
        "r_max": r_max,
        "s_norm": float(s.norm()),
        "k_out": float(k_out),
        "k_in": float(k_in),
    }


def reference_metrics(alpha, values, n_grid, key_mask=None, ranking="attention", distance="euclidean"):
    """reference_row over every row of [rows, key] inputs and every N: name -> [rows, n] float64."""
    alpha = alpha.reshape(-1, alpha.shape[-1])
    values = values.reshape(-1, *values.shape[-2:])
    mask = torch.ones_like(alpha, dtype=torch.bool) if key_mask is None else key_mask.reshape(alpha.shape)
    rows = [
        [reference_row(alpha[r], values[r], mask[r], int(n), ranking, distance) for n in n_grid]
        for r in range(alpha.shape[0])
    ]
    names = rows[0][0].keys()
    return {k: torch.tensor([[cell[k] for cell in row] for row in rows], dtype=torch.float64) for k in names}


def exact_counts(alpha, values, n: int) -> tuple[list[int], list[int]]:
    """K_out and K_in of every row at one N (Euclidean, attention ranking), in exact arithmetic.

    The float64 reference above rounds ||s - y_i|| at ~1e-16 of ||s||, which
    cannot tell apart the keys of real attention rows whose weights are
    1e-20 or smaller. Here every product and sum is exact (Decimal with the
    Inexact trap on) and squared distances are compared directly.
    """
    from decimal import Decimal, Inexact, localcontext

    k_out, k_in = [], []
    with localcontext() as ctx:
        ctx.prec, ctx.Emin, ctx.Emax = 2000, -99999, 99999
        ctx.traps[Inexact] = True
        for a_row, v_row in zip(alpha.tolist(), values.tolist(), strict=True):
            order = sorted(range(len(a_row)), key=lambda i: (-a_row[i], i))
            y = [[Decimal(a_row[i]) * Decimal(x) for x in v_row[i]] for i in range(len(a_row))]
            s = [sum((y[i][k] for i in order[:n]), Decimal(0)) for k in range(len(v_row[0]))]
            d2 = [sum(((sk - yk) ** 2 for sk, yk in zip(s, y[i], strict=True)), Decimal(0)) for i in range(len(y))]
            selected, rest = order[:n], order[n:]
            r_max2 = max(d2[i] for i in selected)
            k_out.append(sum(1 for j in rest if d2[j] <= r_max2))
            if rest:
                r_min2 = min(d2[j] for j in rest)
                k_in.append(sum(1 for i in selected if d2[i] < r_min2))
            else:
                k_in.append(n)
    return k_out, k_in
