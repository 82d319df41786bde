"""Slow, obviously-correct reference implementations written from the paper's definitions.

float64, one row and one N at a time, distances computed directly as
||s - y_i|| (or the cosine distance). The fast engine is compared against these.
"""

import math

import numpy as np
import torch

from tl_geometry.analysis.head_roles import ROLES


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


def reference_margins(alpha, values, mask, n, ranking="attention"):
    """Margins of one row at one N, from eq. 7-11 and the derivation on the Concepts page; None if N > L.

    Keys are ranked by alpha_i (or alpha_i ||v_i|| with ``ranking="contribution"``), ties by key index; key 0 is the sink.
    The sink-aware margins follow the docs' derivation term by term:
    Delta' = a_min^2 - 2 a_out (S rho_out+ + z a_0 rho0_out+) + 2 a_max (S - a_min) rho_in- + 2 z a_0 a_max rho0_in-,
    Delta_0' = a_0^2 - 2 a_out (S rho_out+ + a_0 rho0_out+) + 2 a_0 S rho0_in, B' = max a_I + a_out + sum a_I.
    """
    alpha, values = alpha.double(), values.double()
    visible = [i for i in range(len(alpha)) if bool(mask[i])]
    length = len(visible)
    if n > length:
        return None
    weight = {i: float(alpha[i]) * (float(values[i].norm()) if ranking == "contribution" else 1.0) for i in visible}
    order = sorted(visible, key=lambda i: (-weight[i], i))
    inside, outside = order[:n], order[n:]
    a = {i: float(alpha[i]) * float(values[i].norm()) for i in visible}

    def cos(j, k):
        nj, nk = float(values[j].norm()), float(values[k].norm())
        return 0.0 if nj == 0 or nk == 0 else float(values[j] @ values[k]) / (nj * nk)

    inside_ns = [i for i in inside if i != 0]
    s_in = sum(a[k] for k in inside_ns)
    a_max_out = max((a[j] for j in outside), default=math.nan)
    pairs = [cos(j, k) for j in outside for k in inside_ns]
    rho_out = max(pairs) if pairs else math.nan
    rho = rho_out if pairs else 0.0
    delta = min(a[i] for i in inside_ns) ** 2 - 2 * (a_max_out * s_in * rho if pairs else 0.0) if inside_ns else math.nan
    delta0 = a[0] ** 2 - (s_in * rho) ** 2 if 0 in inside else math.nan
    scale = (max(a[i] for i in inside_ns) if inside_ns else 0.0) + (a_max_out if outside else 0.0) + s_in

    # The sink-aware margins (Concepts: "A lower envelope that bounds").
    sink_in = 0 in visible and 0 in inside
    a0 = a[0] if sink_in else 0.0
    in_pairs = [cos(i, k) for i in inside_ns for k in inside_ns if i < k]
    rho_in = min(in_pairs) if in_pairs else math.nan
    sink_seen = 0 in visible
    rho0_in = min((cos(0, k) for k in inside_ns), default=math.nan) if sink_seen else math.nan
    rho0_out = max((cos(0, j) for j in outside if j != 0), default=math.nan) if sink_seen else math.nan

    def plus(x):
        return 0.0 if math.isnan(x) else max(x, 0.0)

    def minus(x):
        return 0.0 if math.isnan(x) else min(x, 0.0)

    a_out = a_max_out if outside else 0.0
    pull = 2 * a_out * (s_in * plus(rho_out) + a0 * plus(rho0_out))
    if inside_ns:
        a_min, a_max = min(a[i] for i in inside_ns), max(a[i] for i in inside_ns)
        delta_sink = a_min**2 - pull + 2 * a_max * (s_in - a_min) * minus(rho_in) + 2 * a0 * a_max * minus(rho0_in)
    else:
        a_max, delta_sink = 0.0, math.nan
    delta0_sink = a0**2 - pull + 2 * a0 * s_in * (0.0 if math.isnan(rho0_in) else rho0_in) if sink_in else math.nan
    scale_sink = max(a_max, a0) + a_out + s_in + a0

    y = {i: alpha[i] * values[i] for i in visible}
    s = sum((y[k] for k in inside), torch.zeros(values.shape[-1], dtype=torch.float64))
    dist2 = {i: float((s - y[i]) @ (s - y[i])) for i in visible}
    mu = {(i, j): dist2[j] - dist2[i] for i in inside for j in outside}  # eq. 25: E X_ij = D_j^2 - D_i^2
    return {
        "delta": delta, "delta0": delta0, "scale": scale, "s_in": s_in, "rho_out": rho_out,
        "delta_sink": delta_sink, "delta0_sink": delta0_sink, "scale_sink": scale_sink,
        "rho_in": rho_in, "rho0_in": rho0_in, "rho0_out": rho0_out,
        "length": length, "inside": inside, "outside": outside, "mu": mu,
    }


# ---- Spearman's correction of a correlation between noisy per-head means (numpy)


def reference_disattenuated(x, y, noise_x, noise_y, noise_xy):
    """Spearman's correction: the (co)variances over heads (divisor heads - 1) less the mean error ones."""
    ok = ~np.isnan(x) & ~np.isnan(y)
    c = np.cov(x[ok], y[ok])  # ddof 1
    return float(np.clip((c[0, 1] - noise_xy) / np.sqrt((c[0, 0] - noise_x) * (c[1, 1] - noise_y)), -1, 1))


def reference_error_covariance(rx, ry, n_documents):
    """Mean over heads of the covariance over replicates of each head's two means (replicates without a document
    left out), times n / (n - 1)."""
    per_head = [np.cov(a[ok], b[ok])[0, 1] for a, b in zip(rx.T, ry.T) for ok in [~np.isnan(a) & ~np.isnan(b)]]
    return float(np.mean(per_head)) * n_documents / (n_documents - 1)


def reference_shrunk(replicates, means, noise):
    """Each replicate's deviations from the heads' means added to those means shrunk towards their average by
    sqrt(1 - noise / their variance (ddof 1))."""
    factor = np.sqrt(max(0.0, 1 - noise / np.var(means, ddof=1)))
    return means.mean() + factor * (means - means.mean()) + (replicates - means)


def reference_role(f: dict, se: dict, cfg) -> int:
    """The role (index into ROLES) of one head's features ``f`` with standard errors ``se``, by the taxonomy's
    rules as its module docstring states them (``cfg``: a RoleConfig); -1 where the shares are undefined."""
    sink = -math.inf if math.isnan(f["share_sink"]) else f["share_sink"]
    own, rest = f["share_self"], f["share_rest"]
    if math.isnan(own) or math.isnan(rest):
        return -1
    z = {k: _z(f[k], se[k]) for k in ("align_self_excess", "shift_self_raw", "shift_sink_raw")}
    # 1. Mixer: "the last token intermediate between sink and rest; alignment shifts from v_0 towards v_L".
    if _between(f, se, cfg) and _shifts(f, z, cfg):
        return ROLES.index("mixer")
    # 2. Retriever: "the last token dominates; s(N) stays aligned with v_L" (beyond chance).
    if own >= sink and own >= rest and z["align_self_excess"] > cfg.z_align and f["align_self_excess"] >= cfg.align_min:
        return ROLES.index("retriever")
    # 3.-4. The rest dominates and is concentrated: Content; otherwise (sink, or broadly spread) Reset.
    if rest > sink and f["top_rest_share"] >= cfg.concentrated:
        return ROLES.index("content")
    return ROLES.index("reset")


def _z(value: float, se: float) -> float:
    return value / se if se > 0 else math.copysign(math.inf, value) if value else math.nan


def _between(f: dict, se: dict, cfg) -> bool:
    """share_self above the smaller and below the larger of share_sink and share_rest, by z_shift standard errors of
    each difference, sqrt(se_a^2 + se_b^2) (no sink: nothing to be above)."""
    own, rest = f["share_self"], f["share_rest"]
    if math.isnan(f["share_sink"]):
        return own < rest and rest - own > cfg.z_shift * math.hypot(se["share_self"], se["share_rest"])
    (low, se_low), (high, se_high) = sorted([(f["share_sink"], se["share_sink"]), (rest, se["share_rest"])])
    return (own - low > cfg.z_shift * math.hypot(se["share_self"], se_low)
            and high - own > cfg.z_shift * math.hypot(se["share_self"], se_high))


def _shifts(f: dict, z: dict, cfg) -> bool:
    """The raw cos(s, v_L) rises and cos(s, v_0) falls with ln N, each by z_shift standard errors and shift_min."""
    rising = z["shift_self_raw"] > cfg.z_shift and f["shift_self_raw"] >= cfg.shift_min
    falling = z["shift_sink_raw"] < -cfg.z_shift and f["shift_sink_raw"] <= -cfg.shift_min
    return rising and falling


LITERAL = ("retriever", "mixer", "reset", "none")


def reference_literal_role(f: dict, se: dict, cfg) -> int:
    """The paper's sentences of section 4.2 read literally, on norms and raw cosines (index into LITERAL):
    Retriever "||alpha_L v_L|| is largest; s(N) stays strongly aligned with v_L"; Mixer "last token is
    intermediate between sink and rest: alignment shifts from v_0 ... towards v_L"; Reset "||alpha_0 v_0|| is
    comparable to or exceeds the others [or mass is broadly spread]; s(N) remains sink-biased with weak
    cos(s, v_L)"."""
    sink = 0.0 if math.isnan(f["contribution_sink"]) else f["contribution_sink"]
    own, top = f["contribution_last"], f["contribution_top_rest"]
    if math.isnan(own) or math.isnan(top):
        return -1
    z = {k: _z(f[k], se[k]) for k in ("shift_self_raw", "shift_sink_raw")}
    if min(sink, top) < own < max(sink, top) and _shifts(f, z, cfg):
        return LITERAL.index("mixer")
    if own >= sink and own >= top and f["cos_self_raw"] >= cfg.literal_align:
        return LITERAL.index("retriever")
    sink_or_spread = sink >= cfg.comparable * max(own, top) or f["top_rest_share"] < cfg.concentrated
    if sink_or_spread and f["cos_sink_raw"] > f["cos_self_raw"] and f["cos_self_raw"] < cfg.literal_align:
        return LITERAL.index("reset")
    return LITERAL.index("none")


def reference_subtype(at_lag: dict, early: dict, cfg) -> tuple[str, int]:
    """A head's sub-type from its means, one lag at a time: ``(kind, lag)``, kind "none" where the candidate misses a
    floor, lag -1 where the candidate is a secondary sink. ``at_lag``: "top", "attention", "output" -> lists by lag;
    ``early``: "top", "attention", "output" -> the early-key means (NaN: no later rows).

    The lag candidate: the lag >= 1 that is the top rest key of the most rows (the first such lag), a peak where its
    weight is at least subtype_peak times each neighbour's (lag - 1 when >= 1, lag + 1 when there is one). The
    secondary sink is the candidate where its share of later rows is larger (a tie goes to the lag). Named where
    the rows, weight and output reach the floors."""
    top = [0.0 if math.isnan(x) else x for x in at_lag["top"]]
    lag = max(range(1, len(top)), key=lambda k: (top[k], -k))
    weight = [0.0 if math.isnan(x) else x for x in at_lag["attention"]]
    neighbours = ([weight[lag - 1]] if lag - 1 >= 1 else []) + ([weight[lag + 1]] if lag + 1 < len(weight) else [])
    nearest = max(neighbours, default=0.0)
    peak = weight[lag] / nearest if nearest > 0 else math.inf
    sink_rows = 0.0 if math.isnan(early["top"]) else early["top"]
    if sink_rows > top[lag]:
        kind, rows, attention, output, peak, lag = "sink", sink_rows, early["attention"], early["output"], math.inf, -1
    else:
        kind, rows, attention, output = "lag", top[lag], weight[lag], at_lag["output"][lag]
    named = rows >= cfg.subtype_rows and attention >= cfg.subtype_attention and output >= cfg.subtype_output
    return (kind if named and peak >= cfg.subtype_peak else "none"), lag


def reference_subtype_probability(at_lag: dict, at_lag_se: dict, early: dict, early_se: dict, cfg) -> tuple[str, float, bool]:
    """A head's sub-type with the spread of its means (docs: Head roles, "A sub-type near a floor is uncertain").

    ``*_se``: the standard errors, same keys and shapes as the means (NaN or 0: unknown, the floor judged on the
    mean). Each floor holds with probability Phi((mean - floor) / SE); the peak's floor is weight - subtype_peak x
    the larger neighbour's weight >= 0, its SE the two combined as if independent (a tie between the neighbours:
    the lower lag's). Returns ``(kind, probability that every floor holds, uncertain)``; kind is the candidate's
    where the probability beats its complement by ``margin``, else "none".
    """

    def holds(mean: float, floor: float, se: float) -> float:
        mean = -math.inf if math.isnan(mean) else mean
        if math.isnan(se) or se <= 0 or math.isinf(mean):
            return 1.0 if mean >= floor else 0.0
        return 0.5 * (1 + math.erf((mean - floor) / se / math.sqrt(2)))

    top = [0.0 if math.isnan(x) else x for x in at_lag["top"]]
    lag = max(range(1, len(top)), key=lambda k: (top[k], -k))
    weight = [0.0 if math.isnan(x) else x for x in at_lag["attention"]]
    sides = ([lag - 1] if lag - 1 >= 1 else []) + ([lag + 1] if lag + 1 < len(weight) else [])
    near = max(sides, key=lambda k: (weight[k], -k), default=None)
    nearest, nearest_se = (weight[near], at_lag_se["attention"][near]) if near is not None else (0.0, 0.0)
    sink_rows = 0.0 if math.isnan(early["top"]) else early["top"]
    if sink_rows > top[lag]:
        kind = "sink"
        p = (holds(sink_rows, cfg.subtype_rows, early_se["top"]) * holds(early["attention"], cfg.subtype_attention, early_se["attention"])
             * holds(early["output"], cfg.subtype_output, early_se["output"]))  # fmt: skip
    else:
        kind = "lag"
        peak_se = math.sqrt(at_lag_se["attention"][lag] ** 2 + cfg.subtype_peak**2 * nearest_se**2)
        p = (holds(top[lag], cfg.subtype_rows, at_lag_se["top"][lag])
             * holds(weight[lag], cfg.subtype_attention, at_lag_se["attention"][lag])
             * holds(at_lag["output"][lag], cfg.subtype_output, at_lag_se["output"][lag])
             * holds(weight[lag] - cfg.subtype_peak * nearest, 0.0, peak_se))  # fmt: skip
    named, ruled_out = p - (1 - p) >= cfg.margin - 1e-12, (1 - p) - p >= cfg.margin - 1e-12
    return (kind if named else "none"), p, not named and not ruled_out


def reference_tradeoff_margin(roles, precision, recall, grid) -> float:
    """Figure 11's smallest margin (docs/claims.md, "A set interval for trade-offs by role"): ``roles`` per head
    (flat) a role name (any other name or None: in no group) or a mapping role name -> weight (the probability-
    weighted statistic); ``precision`` and ``recall`` ``[head][n]`` (NaN: undefined). A group's curve at N is the
    weighted mean over its heads defined there (undefined without weight); its value over a range of N the mean of
    the curve where defined; mid N is 8 to a quarter of the largest N, large N from half of it; a margin that reads
    an undefined value is -1."""
    largest = max(grid)
    mid = [j for j, n in enumerate(grid) if 8 <= n <= 0.25 * largest]
    large = [j for j, n in enumerate(grid) if n >= 0.5 * largest]

    def weight(role, group):
        return sum(role.get(r, 0.0) for r in group) if isinstance(role, dict) else float(role in group)

    def value(group, metric, columns):
        curve = []
        for j in columns:
            heads = [(weight(role, group), metric[h][j]) for h, role in enumerate(roles) if not math.isnan(metric[h][j])]
            total = sum(w for w, _ in heads)
            if total > 0:
                curve.append(sum(w * x for w, x in heads) / total)
        return sum(curve) / len(curve) if curve else math.nan

    def margin(x):
        return -1.0 if math.isnan(x) else x

    others = ("mixer", "reset")
    rises = [margin(value(("reset",), m, large) - value(("reset",), m, mid)) for m in (precision, recall)]
    return min(margin(value(("retriever",), recall, large) - value(others, recall, large)),
               margin(value(others, precision, large) - value(("retriever",), precision, large)),
               min(rises))
