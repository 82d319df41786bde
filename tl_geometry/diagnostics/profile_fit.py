"""Fit of the four-phase attention profile of Assumption 3 (paper section 3.3, Figure 4).

The model, for positions i = 0..L of one attention row (0 the sink, L the query):

    alpha_0 = p_sink
    alpha_i = p_base                              1 <= i <= T1      (plateau)
    alpha_i = p_base * (1 + eta * cos(omega * i)) T1 < i <= T2      (oscillation)
    alpha_i = p_base * exp(eta * (i - T2))        i > T2            (recency)

with one eta for both the oscillation and the growth, as the paper writes it,
and ``0 <= T1 <= T2 <= L`` (``T1 = T2``: no oscillation; ``T1 = 0``: no
plateau; ``T2 = L``: no recency).

How it is fitted, robustly and vectorised over rows (no iterative optimiser
that could silently stop short; the fit error is always reported). A row's
fit depends on its own values 0..L alone: the rows of each length L are fitted
together on exactly their L + 1 positions, so the same row alone, padded with
NaN, or in any batch gets the same fit (the knots, periodogram, grids and sums
below all use the row's own L).

1. ``p_sink = alpha_0`` (the sink phase is one point; least squares gives it).
2. In log space (weights floored at ``LOG_FLOOR``), for every candidate
   ``(T1, T2, omega)`` the model is linearised (``log(1 + eta c) ~ eta c``), so
   that ``(log p_base, eta)`` is a closed-form 2-parameter least squares, and
   its error follows from a few sums over the phases: prefix sums (read at
   the knots only, for the coarse grid) where many breakpoints share a
   frequency, direct sums where each frequency has one pair of breakpoints.
3. Candidates: every integer ``T1 = T2`` (no oscillation); for the oscillation,
   a coarse grid of breakpoints (17 evenly spaced plus ``L - 2^k``, k < 9) and of
   frequencies (periods log-spaced from 2 to 2048 tokens), plus, with T2 the
   recency start found without oscillation, each coarse T1 before it with the
   peak frequency of the periodogram of (T1, T2] (zero-padded to at least
   ``4 (L + 1)`` points, rounded up to a length of factors 2, 3 and 5, which
   FFTs take several times faster than e.g. 4100 = 4 * 1025); then ``_REFINE_ROUNDS`` rounds of refinement: omega
   on a fine grid around the best one (narrower each round), every integer T1
   given T2, every integer T2 given T1.
   Errors within rounding noise of the least (``1e-9`` relative plus
   ``1e-12 (L + sum y^2)``, y the centred log weights) are ties, and each
   pick among tied candidates is fixed rather than left to the noise: the
   last one, i.e. the longest plateau (a flat row is all plateau, and recency
   from position 1, T2 = 0, is reported as T1 = T2 = 1 with
   ``p_base = alpha_1``: the same curve), the latest T2, the highest
   frequency; a periodogram candidate replaces the coarse one only if
   strictly better. So multiplying a row by a constant c (which moves every
   log weight above ``LOG_FLOOR`` by log c) multiplies ``p_sink`` and
   ``p_base`` by c and leaves the rest unchanged up to rounding; without the
   tolerance, ties such as T1 vs T1 + 1 at omega = pi / 2 (cos(omega i) = 0
   at odd i) were decided by the last bits of log alpha.
4. The oscillation is kept only if it lowers the squared log error of the best
   fit without it by more than ``OSC_MIN_GAIN`` (relative) plus the tie
   tolerance; otherwise ``T1 = T2``, ``omega`` NaN, ``has_oscillation`` 0.
5. ``(log p_base, eta)`` is polished on the exact model by a few Gauss-Newton
   steps, each kept only if it lowers the error.

The fit error is the root-mean-square error of ``log alpha_i`` over i = 1..L
(natural log).
"""

import math
from dataclasses import dataclass, fields

import einops
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from tl_geometry.errors import GeometryError

LOG_FLOOR = 1e-30  # weights below this (underflowed softmax) are raised to it before the log
OSC_MIN_GAIN = 0.05  # relative drop in squared log error the oscillatory phase must bring
MIN_POSITIONS = 4  # rows with fewer non-sink positions are not fitted (NaN)
_PERIODS = torch.logspace(math.log10(2.0), math.log10(2048.0), 32, dtype=torch.float64)
_FINE_OMEGAS = 21
_REFINE_ROUNDS = 5
_PERIODOGRAM_PAD = 4  # zero padding of the periodogram: frequency step <= 2 pi / (4 (L + 1)), refined afterwards
_EVEN_KNOTS, _END_KNOTS = 17, 9  # coarse breakpoints: evenly spaced, and L - 2^k near the query
_GAUSS_NEWTON_STEPS = 8


@dataclass(frozen=True)
class ProfileFit:
    """Fitted four-phase profile parameters, one per row (``[...]``; ``[layer, head_index]`` on a result).

    Attributes:
        p_sink: attention weight of the sink (position 0).
        p_base: plateau weight.
        eta: oscillation amplitude and recency growth rate (NaN with neither phase).
        omega: oscillation frequency in radians per position (NaN without oscillation).
        t1: end of the plateau (0: no plateau).
        t2: start of the recency phase (= t1: no oscillation; = L: no recency).
        error: root-mean-square error of ``log alpha_i`` over positions 1..L.
        has_plateau, has_oscillation, has_recency: 1.0 where the phase is
            present, else 0.0 (on a result: the fraction of sequences with it).
    """

    p_sink: Tensor
    p_base: Tensor
    eta: Tensor
    omega: Tensor
    t1: Tensor
    t2: Tensor
    error: Tensor
    has_plateau: Tensor
    has_oscillation: Tensor
    has_recency: Tensor

    def __post_init__(self) -> None:
        shape = self.p_sink.shape
        for f in fields(self):
            t = getattr(self, f.name)
            if not isinstance(t, Tensor) or t.shape != shape:
                raise GeometryError(
                    f"ProfileFit.{f.name}: expected a tensor of shape {list(shape)} (that of p_sink), "
                    f"got {getattr(t, 'shape', type(t).__name__)}"
                )

    def as_fields(self, prefix: str = "") -> dict[str, Tensor]:
        """Every parameter by name (with ``prefix``), e.g. as a diagnostic's fields."""
        return {prefix + f.name: getattr(self, f.name) for f in fields(self)}

    def evaluate(self, n_pos: int) -> Float[Tensor, "... pos"]:
        """The fitted profile at positions 0..n_pos-1 (see `four_phase_profile`)."""
        return four_phase_profile(self.p_sink, self.p_base, self.eta, self.omega, self.t1, self.t2, n_pos)


def four_phase_profile(
    p_sink: Tensor, p_base: Tensor, eta: Tensor, omega: Tensor, t1: Tensor, t2: Tensor, n_pos: int
) -> Float[Tensor, "... pos"]:
    """Assumption 3's profile at positions 0..n_pos-1; NaN ``eta`` / ``omega`` count as 0 (absent phases).

    >>> one = torch.tensor(1.0)
    >>> four_phase_profile(one, one / 10, torch.tensor(0.5), torch.tensor(math.pi), one, 3 * one, 5).float()
    tensor([1.0000, 0.1000, 0.1500, 0.0500, 0.1649])
    """
    i = torch.arange(n_pos, dtype=torch.float64)
    p_sink, p_base, eta, omega, t1, t2 = (x.double().unsqueeze(-1) for x in (p_sink, p_base, eta, omega, t1, t2))
    eta, omega = torch.nan_to_num(eta), torch.nan_to_num(omega)
    osc = p_base * (1 + eta * torch.cos(omega * i))
    rec = p_base * torch.exp(eta * (i - t2))
    out = torch.where(i <= t1, p_base, torch.where(i <= t2, osc, rec))
    return torch.where(i == 0, p_sink, out)


def _fft_length(n: int) -> int:
    """The least length >= n with no prime factor above 5 (FFTs of such lengths are fastest).

    >>> _fft_length(4100), _fft_length(4096), _fft_length(7)
    (4320, 4096, 8)
    """
    best = 1 << max(0, (n - 1).bit_length())
    power5 = 1
    while power5 < best:
        power35 = power5
        while power35 < best:
            m = power35
            while m < n:
                m *= 2
            best = min(best, m)
            power35 *= 3
        power5 *= 5
    return best


def _cum(x: Float[Tensor, "*b pos"]) -> Float[Tensor, "*b pos"]:
    """Inclusive prefix sums: the sum over positions (lo, hi] is ``C[hi] - C[lo]`` (lo >= 0)."""
    return x.cumsum(-1)


def _range_sum(
    cum: Float[Tensor, "row k pos"], lo: Int[Tensor, "row m"], hi: Int[Tensor, "row m"]
) -> Float[Tensor, "row k m"]:
    """Sums over positions (lo, hi] of each of the k prefix-summed series."""
    k = cum.shape[1]
    upper = cum.gather(2, hi.unsqueeze(1).expand(-1, k, -1))
    lower = cum.gather(2, lo.unsqueeze(1).expand(-1, k, -1))
    return upper - lower


@dataclass(frozen=True)
class _Series:
    """Prefix sums of one batch of rows: centred log weights y and positions i over 1..L."""

    y: Float[Tensor, "row pos"]  # centred log weights, 0 outside 1..L
    mask: Float[Tensor, "row pos"]  # 1 on positions 1..L
    length: Int[Tensor, " row"]  # L
    rec: Float[Tensor, "row 5 pos"]  # prefix sums of 1, i, i^2, y, y*i
    total: Float[Tensor, "row 3"]  # n, sum y, sum y^2 over 1..L

    def osc(self, omega: Float[Tensor, "row w"]) -> Float[Tensor, "row w 3 pos"]:
        """Prefix sums of c, c^2 and y*c with c = cos(omega * i), for each row's frequencies."""
        i = torch.arange(self.y.shape[1], dtype=torch.float64, device=self.y.device)
        c = torch.cos(omega.unsqueeze(-1) * i) * self.mask.unsqueeze(1)
        series = torch.empty(*c.shape[:2], 3, c.shape[2], dtype=c.dtype, device=c.device)
        torch.mul(c, c, out=series[:, :, 1])
        torch.mul(c, self.y.unsqueeze(1), out=series[:, :, 2])
        series[:, :, 0] = c
        return _cum(series)


def _series(y: Float[Tensor, "row pos"], length: Int[Tensor, " row"]) -> _Series:
    i = torch.arange(y.shape[1], dtype=torch.float64, device=y.device)
    mask = ((i >= 1) & (i <= length.unsqueeze(-1))).double()
    y = y * mask
    rec = _cum(torch.stack([mask, mask * i, mask * i * i, y, y * i], dim=1))
    total = torch.stack([mask.sum(-1), y.sum(-1), (y * y).sum(-1)], dim=-1)
    return _Series(y=y, mask=mask, length=length, rec=rec, total=total)


def _recency_sums(s: _Series, t2: Int[Tensor, "row w c"]) -> tuple[Float[Tensor, "row w c"], ...]:
    """Sums over the recency phase (T2, L] of 1, i, i^2, y and y*i."""
    rows, wt, c = t2.shape
    length = s.length[:, None, None].expand(rows, wt, c)
    r = _range_sum(s.rec, t2.reshape(rows, -1), length.reshape(rows, -1)).reshape(rows, 5, wt, c)
    return tuple(r.unbind(1))


def _closed_form(
    s: _Series,
    osc_sums: tuple[Float[Tensor, "row w c"], ...],
    rec_sums: tuple[Float[Tensor, "row _ #c"], ...],
    t2: Int[Tensor, "row _ #c"],
) -> tuple[Float[Tensor, "row w c"], Float[Tensor, "row w c"], Float[Tensor, "row w c"]]:
    """``(b, eta, sse)`` of the linearised model from its sums over the oscillation and recency phases."""
    sc, scc, syc = osc_sums
    n_r, si, sii, sy_r, syi = rec_sums
    t = t2.double()
    sx = sc + si - t * n_r
    sxx = scc + sii - 2 * t * si + t * t * n_r
    sxy = syc + syi - t * sy_r
    n, sy, syy = (x[:, None, None] for x in s.total.unbind(-1))
    det = n * sxx - sx * sx
    eta = torch.where(det > 1e-9 * n * sxx.clamp(min=1e-300), (n * sxy - sx * sy) / det.clamp(min=1e-300), 0.0)
    b = (sy - eta * sx) / n
    sse = (syy - b * sy - eta * sxy).clamp(min=0.0)
    return b, eta, sse


def _linear_fit(
    s: _Series, osc: Float[Tensor, "row w 3 pos"], t1: Int[Tensor, "row _ c"], t2: Int[Tensor, "row _ #c"]
) -> tuple[Float[Tensor, "row w c"], Float[Tensor, "row w c"], Float[Tensor, "row w c"]]:
    """Closed-form least squares of the linearised model for every candidate: ``(b, eta, sse)``.

    ``osc`` are the prefix sums of `_Series.osc`; ``t1`` and ``t2`` are
    ``[row, w, c]`` or ``[row, 1, c]`` (the same breakpoints for every frequency).
    """
    rows, w, c = osc.shape[0], osc.shape[1], t1.shape[2]
    # Recency sums depend on T2 only: computed once when T2 does not vary with omega (axis 1 of size 1).
    rec_sums = _recency_sums(s, t2)
    lo, hi = t1.expand(rows, w, c).reshape(rows * w, c), t2.expand(rows, w, c).reshape(rows * w, c)
    o = _range_sum(osc.reshape(rows * w, 3, -1), lo, hi)
    return _closed_form(s, o.reshape(rows, w, 3, c).unbind(2), rec_sums, t2)


_TRIG_BLOCK = 32  # positions i = a * _TRIG_BLOCK + b in `region_cosine_sums`


def region_cosine_sums(
    y: Float[Tensor, "row pos"], omega: Float[Tensor, "row w"], lo: Int[Tensor, "row #w"], hi: Int[Tensor, " row"]
) -> tuple[Float[Tensor, "row w"], Float[Tensor, "row w"], Float[Tensor, "row w"]]:
    """Sums of c, c^2 and y*c over positions (lo, hi], c = cos(omega * i), for each candidate frequency.

    ``lo`` is one per candidate, or ``[row, 1]``: one region for all of a
    row's frequencies. Written as ``i = a B + b`` (``B = _TRIG_BLOCK``),
    ``cos(omega i) = cos(omega a B) cos(omega b) - sin(omega a B) sin(omega b)``:
    the sum over b is a matrix product and only ``2 (pos / B + B)`` sines and
    cosines per candidate are evaluated instead of ``pos`` (float64 cosines
    dominated the fit); ``c^2 = (1 + cos(2 omega i)) / 2``. The rounding is that
    of the direct sums (about 1e-13), far below the fit's tie tolerance.
    """
    n_pos = y.shape[1]
    n_blocks = -(-n_pos // _TRIG_BLOCK)
    width = n_blocks * _TRIG_BLOCK
    i = torch.arange(width, dtype=torch.float64, device=y.device)
    region = ((i > lo.unsqueeze(-1)) & (i <= hi[:, None, None])).double()  # [row, 1 or w, width]; 0 past the row
    y = torch.nn.functional.pad(y, (0, width - n_pos))
    series = torch.stack([region * y.unsqueeze(1), region], dim=2)  # sums against cosines: of y*c and of c
    series = series.view(*series.shape[:3], n_blocks, _TRIG_BLOCK)
    b = torch.arange(_TRIG_BLOCK, dtype=torch.float64, device=y.device)
    inner = torch.cat([omega.unsqueeze(-1) * b, 2 * omega.unsqueeze(-1) * b], dim=-1).view(*omega.shape, 2, -1)
    inner = torch.cat([inner.cos(), inner.sin()], dim=-2).transpose(-1, -2)  # [row, w, B, (cos w, cos 2w, sin w, sin 2w)]
    if lo.shape[1] == 1:  # one region per row: one matrix product per row
        blocks = einops.einsum(series[:, 0], inner, "row s a b, row w b t -> row w s a t")
    else:
        blocks = einops.einsum(series, inner, "row w s a b, row w b t -> row w s a t")
    outer = omega.unsqueeze(-1) * torch.arange(n_blocks, dtype=torch.float64, device=y.device) * _TRIG_BLOCK
    outer_cos, outer_sin = outer.cos(), outer.sin()
    twice = 2 * outer
    yc = (blocks[:, :, 0, :, 0] * outer_cos - blocks[:, :, 0, :, 2] * outer_sin).sum(-1)
    c = (blocks[:, :, 1, :, 0] * outer_cos - blocks[:, :, 1, :, 2] * outer_sin).sum(-1)
    c2 = (blocks[:, :, 1, :, 1] * twice.cos() - blocks[:, :, 1, :, 3] * twice.sin()).sum(-1)
    return c, (region.sum(-1) + c2) / 2, yc


def _region_fit(
    s: _Series, omega: Float[Tensor, "row w"], t1: Int[Tensor, "row #w"], t2: Int[Tensor, " row"]
) -> tuple[Float[Tensor, "row w 1"], Float[Tensor, "row w 1"], Float[Tensor, "row w 1"]]:
    """`_linear_fit` for one (T1, T2) per frequency (or one T1 for all): the sums over (T1, T2] taken directly."""
    # T1 >= 0 and T2 <= L, so the region lies inside 1..L.
    osc_sums = tuple(x.unsqueeze(-1) for x in region_cosine_sums(s.y, omega, t1, t2))
    t2 = t2[:, None, None]
    return _closed_form(s, osc_sums, _recency_sums(s, t2), t2)


def _knot_prefix_sums(
    s: _Series, omegas: Float[Tensor, " w"], knots: Int[Tensor, "row k"]
) -> Float[Tensor, "row w 3 k"]:
    """Prefix sums of c, c^2 and y*c (c = cos(omega * i)) up to each knot, for frequencies shared by all rows.

    The coarse search reads the prefix sums only at its knots: the sums of c
    and c^2 do not depend on the row (one cumsum for all rows), and those of
    y*c are one matrix product, rather than a prefix sum per row, frequency
    and position.
    """
    i = torch.arange(s.y.shape[1], dtype=torch.float64, device=s.y.device)
    c = torch.cos(omegas.unsqueeze(-1) * i) * (i >= 1)  # [w, pos]; position 0 is the sink
    shared = torch.stack([c, c * c]).cumsum(-1)[:, :, knots]  # [2, w, row, k]
    upto = s.y.unsqueeze(1) * (i <= knots.unsqueeze(-1))  # [row, k, pos]: y over 1..knot (y is 0 past L)
    yc = (upto.reshape(-1, len(i)) @ c.T).reshape(*knots.shape, -1)  # [row, k, w]
    return torch.stack([shared[0].permute(1, 0, 2), shared[1].permute(1, 0, 2), yc.transpose(1, 2)], dim=2)


def _tolerance(s: _Series) -> Float[Tensor, " row"]:
    """Squared log errors closer than this (plus ``1e-9`` relative) are ties: rounding noise, not a better fit.

    Scale free: y is centred, so ``n + sum y^2`` does not change when the row
    is multiplied by a constant (which moves every log weight by the same amount).
    """
    n, _, syy = s.total.unbind(-1)
    return 1e-12 * (n + syy)


def _tie_bound(least: Float[Tensor, " row"], tol: Float[Tensor, " row"]) -> Float[Tensor, " row"]:
    """Errors up to this are tied with ``least``."""
    return least * (1 + 1e-9) + tol


def _last_at_most(x: Float[Tensor, "row n"], bound: Float[Tensor, " row"]) -> Int[Tensor, " row"]:
    """Index of the last entry of each row that is ``<= bound`` (argmax returns the first maximum: flip)."""
    return x.shape[1] - 1 - (x <= bound.unsqueeze(-1)).flip(-1).to(torch.uint8).argmax(-1)


def _best(sse: Float[Tensor, "row w c"], tol: Float[Tensor, " row"]) -> tuple[Int[Tensor, " row"], Int[Tensor, " row"]]:
    """The last (largest ``(w, c)``) of the candidates tied for the least error: ``(w, c)`` indices.

    A plain argmin would let rounding noise pick among ties (e.g. at omega =
    pi / 2, where cos(omega i) = 0 at odd i, T1 and T1 + 1 fit equally), and
    the noise differs between a row and the same row times a constant. Two
    stages (the last w with a tie, then the last c in it) read the whole grid
    once, for its minima.
    """
    by_w = sse.amin(2)
    bound = _tie_bound(by_w.amin(1), tol)
    w = _last_at_most(by_w, bound)
    c = _last_at_most(sse[torch.arange(sse.shape[0], device=sse.device), w], bound)
    return w, c


@dataclass(frozen=True)
class _Phases:
    """Which phase each position is in and the oscillation's cosine, fixed while (b, eta) are polished."""

    cos: Float[Tensor, "row pos"]  # cos(omega * i)
    in_osc: Bool[Tensor, "row pos"]  # T1 < i <= T2
    in_rec: Bool[Tensor, "row pos"]  # i > T2
    since_t2: Float[Tensor, "row pos"]  # i - T2


def _phases(s: _Series, omega: Tensor, t1: Tensor, t2: Tensor) -> _Phases:
    i = torch.arange(s.y.shape[1], dtype=torch.float64, device=s.y.device)
    return _Phases(
        cos=torch.cos(omega.unsqueeze(-1) * i),
        in_osc=(i > t1.unsqueeze(-1)) & (i <= t2.unsqueeze(-1)),
        in_rec=i > t2.unsqueeze(-1),
        since_t2=i - t2.unsqueeze(-1).double(),
    )


def _exact_residual(
    s: _Series, ph: _Phases, b: Tensor, eta: Tensor
) -> tuple[Float[Tensor, "row pos"], Float[Tensor, "row pos"], Float[Tensor, " row"]]:
    """Residual of the exact log model, its derivative in eta (both zero outside 1..L), and its sum of squares."""
    e = eta.unsqueeze(-1)
    ec = e * ph.cos
    f = torch.where(ph.in_osc, torch.log1p(ec.clamp(min=-0.999999)), torch.where(ph.in_rec, e * ph.since_t2, 0.0))
    df = torch.where(ph.in_osc, ph.cos / (1 + ec).clamp(min=1e-6), torch.where(ph.in_rec, ph.since_t2, 0.0))
    res = (s.y - b.unsqueeze(-1) - f) * s.mask
    return res, df * s.mask, (res * res).sum(-1)


def _gauss_newton(s: _Series, b: Tensor, eta: Tensor, omega: Tensor, t1: Tensor, t2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Polish (b, eta) on the exact model; each step is kept only where it lowers the error."""
    limit = torch.where(t2 > t1, 0.999, math.inf)  # 1 + eta cos > 0 in the oscillation
    ph = _phases(s, omega, t1, t2)
    res, df, sse = _exact_residual(s, ph, b, eta)
    n = s.mask.sum(-1)
    for _ in range(_GAUSS_NEWTON_STEPS):
        sd, sdd = df.sum(-1), (df * df).sum(-1)
        sr, srd = res.sum(-1), (res * df).sum(-1)
        det = n * sdd - sd * sd
        ok = det > 1e-12 * n * sdd.clamp(min=1e-300)
        d_eta = torch.where(ok, (n * srd - sd * sr) / det.clamp(min=1e-300), 0.0)
        d_b = (sr - d_eta * sd) / n
        new_b, new_eta = b + d_b, (eta + d_eta).clamp(-limit, limit)
        new_res, new_df, new_sse = _exact_residual(s, ph, new_b, new_eta)
        better = new_sse < sse
        if not bool(better.any()):  # nothing moved, so the next step would propose the same again
            break
        b, eta, sse = torch.where(better, new_b, b), torch.where(better, new_eta, eta), torch.where(better, new_sse, sse)
        res, df = torch.where(better.unsqueeze(-1), new_res, res), torch.where(better.unsqueeze(-1), new_df, df)
    return b, eta, sse


def _fit_rows(alpha: Float[Tensor, "row pos"]) -> dict[str, Tensor]:
    """The fit of rows all defined on positions 0..L, ``L = pos - 1``, no padding (float64).

    Everything that depends on the length (knots, periodogram, grids, sums) is
    built from this L, so a row's fit does not depend on the other rows.
    """
    rows, n_pos = alpha.shape
    device = alpha.device
    length = torch.full((rows,), n_pos - 1, device=device)
    logs = torch.log(torch.nan_to_num(alpha, nan=1.0).clamp(min=LOG_FLOOR))
    positions = torch.arange(n_pos, device=device)
    inside = (positions >= 1) & (positions <= length.unsqueeze(-1))
    mean = (logs * inside).sum(-1) / inside.sum(-1).clamp(min=1)
    s = _series(logs - mean.unsqueeze(-1), length)
    tol = _tolerance(s)
    grid = positions.expand(rows, n_pos)
    lmax = length.unsqueeze(-1)

    # Without oscillation: every integer T1 = T2 in 0..L.
    t_all = grid.clamp(max=lmax).unsqueeze(1)
    zero_omega = s.osc(torch.zeros(rows, 1, dtype=torch.float64, device=device))
    b0, eta0, sse0 = _linear_fit(s, zero_omega, t_all, t_all)
    sse0 = sse0.masked_fill(grid.unsqueeze(1) > lmax.unsqueeze(1), math.inf)
    # Ties (a flat row fits every T with eta = 0): the longest plateau, i.e. the last near-minimal T.
    pick = _best(sse0, tol)[1]
    none_t = t_all[:, 0].gather(1, pick[:, None]).squeeze(1)
    none_sse = sse0[:, 0].gather(1, pick[:, None]).squeeze(1)

    # With oscillation: coarse grid of (T1 < T2, omega), then refinement.
    fractions = torch.linspace(0, 1, _EVEN_KNOTS, dtype=torch.float64, device=device)
    ends = length.unsqueeze(-1) - 2 ** torch.arange(_END_KNOTS, device=device)
    knots = torch.cat([(fractions * length.unsqueeze(-1)).round().long(), ends.clamp(min=0)], dim=-1)  # [row, k]
    first, second = torch.triu_indices(knots.shape[1], knots.shape[1], offset=1, device=device)
    swap = knots[:, first] > knots[:, second]
    lo, hi = torch.where(swap, second, first), torch.where(swap, first, second)  # [row, pair]: knot indices
    t1c, t2c = knots.gather(1, lo), knots.gather(1, hi)
    omegas = 2 * math.pi / _PERIODS.to(device)
    at_knots = _knot_prefix_sums(s, omegas, knots)  # [row, w, 3, k]
    ends = at_knots.gather(3, torch.cat([hi, lo], 1)[:, None, None, :].expand(rows, len(omegas), 3, -1))
    osc_sums = tuple((ends[..., : hi.shape[1]] - ends[..., hi.shape[1] :]).unbind(2))  # sums over (T1, T2]
    _, _, sse = _closed_form(s, osc_sums, _recency_sums(s, t2c.unsqueeze(1)), t2c.unsqueeze(1))
    sse = sse.masked_fill((t1c >= t2c).unsqueeze(1), math.inf)
    omegas = omegas.expand(rows, -1)
    wi, ci = _best(sse, tol)
    best_sse = sse[torch.arange(rows, device=device), wi, ci]
    omega = omegas.gather(1, wi[:, None]).squeeze(1)
    t1, t2 = t1c.gather(1, ci[:, None]).squeeze(1), t2c.gather(1, ci[:, None]).squeeze(1)
    # Also: the recency start found without oscillation (usually the right T2), each coarse T1 before it,
    # and for each the frequency from the periodogram of the oscillation region (fine enough for long regions).
    k1 = torch.minimum(knots, (none_t - 1).clamp(min=0).unsqueeze(-1))  # [row, k]
    region = (grid.unsqueeze(1) > k1.unsqueeze(-1)) & (grid.unsqueeze(1) <= none_t[:, None, None])  # [row, k, pos]
    # float32 throughout: only the argmax is used, and the refinement below works in float64.
    region = region.float()
    z = s.y.float().unsqueeze(1) * region
    z = (z - z.sum(-1, keepdim=True) / region.sum(-1, keepdim=True).clamp(min=1)) * region
    n_fft = _fft_length(_PERIODOGRAM_PAD * n_pos)  # n_pos = L + 1
    spectrum = torch.fft.rfft(z, n=n_fft, dim=-1).real.abs()
    spectrum[..., 0] = -1.0  # omega = 0 is the plateau, not an oscillation
    omega_k = 2 * math.pi * spectrum.argmax(-1).double() / n_fft
    _, _, sse_k = _region_fit(s, omega_k, k1, none_t)
    sse_k = sse_k[..., 0].masked_fill(k1 >= none_t.unsqueeze(-1), math.inf)  # [row, k]
    pick_k = _best(sse_k.unsqueeze(1), tol)[1].unsqueeze(-1)
    sse_kp = sse_k.gather(1, pick_k).squeeze(1)
    better = best_sse > _tie_bound(sse_kp, tol)  # a tie keeps the coarse candidate
    omega = torch.where(better, omega_k.gather(1, pick_k).squeeze(1), omega)
    t1 = torch.where(better, k1.gather(1, pick_k).squeeze(1), t1)
    t2 = torch.where(better, none_t, t2)
    span = float(_PERIODS[1] / _PERIODS[0])  # one coarse step; each round narrows to two fine steps
    for _ in range(_REFINE_ROUNDS):
        fine = omega.unsqueeze(-1) * torch.logspace(-1, 1, _FINE_OMEGAS, base=span, dtype=torch.float64, device=device)
        fine = fine.clamp(max=math.pi)
        span = span ** (4 / (_FINE_OMEGAS - 1))  # the next round covers two steps either side
        _, _, sse = _region_fit(s, fine, t1.unsqueeze(-1), t2)
        omega = fine.gather(1, _best(sse, tol)[0][:, None]).squeeze(1)
        osc = s.osc(omega.unsqueeze(-1))
        _, _, sse = _linear_fit(s, osc, grid.unsqueeze(1), t2[:, None, None])  # recency sums: once per row
        t1 = _best(sse.masked_fill((grid >= t2.unsqueeze(-1)).unsqueeze(1), math.inf), tol)[1]
        _, _, sse = _linear_fit(s, osc, t1[:, None, None].expand(-1, 1, n_pos), grid.unsqueeze(1))
        t2 = _best(sse.masked_fill(((grid <= t1.unsqueeze(-1)) | (grid > lmax)).unsqueeze(1), math.inf), tol)[1]
    osc = s.osc(omega.unsqueeze(-1))
    b1, eta1, osc_sse = (x[:, 0, 0] for x in _linear_fit(s, osc, t1[:, None, None], t2[:, None, None]))

    use_osc = (none_sse - osc_sse) > OSC_MIN_GAIN * none_sse + tol
    b0, eta0 = (x[:, 0].gather(1, pick[:, None]).squeeze(1) for x in (b0, eta0))
    t1 = torch.where(use_osc, t1, none_t)
    t2 = torch.where(use_osc, t2, none_t)
    omega = torch.where(use_osc, omega, 0.0)
    b, eta, sse = _gauss_newton(s, torch.where(use_osc, b1, b0), torch.where(use_osc, eta1, eta0), omega, t1, t2)
    has_rec = t2 < length
    return {
        "p_sink": alpha[:, 0],
        "p_base": torch.exp(b + mean),
        "eta": eta.masked_fill(~use_osc & ~has_rec, math.nan),
        "omega": omega.masked_fill(~use_osc, math.nan),
        "t1": t1.double(),
        "t2": t2.double(),
        "error": (sse / length.clamp(min=1)).sqrt(),
        "has_plateau": (t1 >= 1).double(),
        "has_oscillation": use_osc.double(),
        "has_recency": has_rec.double(),
    }


def fit_bytes_per_row(n_pos: int) -> int:
    """Working memory of the fit per row of ``n_pos`` positions, in bytes (an upper bound).

    Measured (tests/test_profile_fit.py checks it): about 19 float64 planes of
    ``[omega, knot pair]`` (the coarse grid's sums and errors; 1.55 MB a row)
    and 174 float64 per position (the oscillation series, the periodograms);
    the count here rounds both up.
    """
    n_knots = _EVEN_KNOTS + _END_KNOTS
    pairs = n_knots * (n_knots - 1) // 2
    return 8 * (20 * len(_PERIODS) * pairs + 180 * n_pos)


def fit_attention_profile(alpha: Tensor, memory_budget_mib: float | None = None) -> ProfileFit:
    """Fit Assumption 3's four-phase profile to attention rows, each on its own positions 0..L.

    The rows of each length are fitted at once (vectorised); a row's fit does
    not depend on the padding or on the other rows.

    Args:
        alpha: attention weights ``[..., pos]``, position 0 the sink, each row
            defined on positions 0..L and NaN after (L may differ per row).
        memory_budget_mib: the fit's working memory: rows are fitted in slices
            of at most that (`fit_bytes_per_row` each; one row at least); None:
            every row of a length at once.

    Returns:
        ProfileFit with ``[...]`` tensors (float32); rows with fewer than
        ``MIN_POSITIONS`` non-sink positions are NaN throughout.

    Raises:
        GeometryError: no position axis, negative weights, or NaN inside a row.

    >>> i = torch.arange(40.0)
    >>> row = torch.where(i > 30, 1e-3 * torch.exp(0.2 * (i - 30)), torch.tensor(1e-3))
    >>> row[0] = 0.5
    >>> fit = fit_attention_profile(row)
    >>> int(fit.t2), round(float(fit.eta), 3), bool(fit.has_oscillation)
    (30, 0.2, False)
    """
    if alpha.ndim < 1 or alpha.shape[-1] < 1:
        raise GeometryError(f"alpha: expected attention rows [..., pos], got shape {list(alpha.shape)}")
    rows = alpha.reshape(-1, alpha.shape[-1]).double()
    defined = ~rows.isnan()
    length = defined.sum(-1) - 1
    if not torch.equal(defined, torch.arange(rows.shape[1], device=rows.device) <= length.unsqueeze(-1)):
        raise GeometryError("alpha: NaN inside a row; each row must be defined on positions 0..L and NaN only after L")
    if bool((rows[defined] < 0).any()):
        raise GeometryError("alpha: negative attention weights; pass softmax probabilities")
    # Each row is fitted on its own positions 0..L only, so neither the padding nor the other rows can change
    # its fit: the rows of each length L are fitted together, on exactly L + 1 positions.
    out = {f.name: torch.full(length.shape, math.nan, dtype=torch.float64, device=rows.device) for f in fields(ProfileFit)}
    for n in length.unique().tolist():
        if n < MIN_POSITIONS:
            continue  # too short: NaN throughout
        which = (length == n).nonzero().squeeze(-1)
        size = len(which)
        if memory_budget_mib is not None:
            size = max(1, min(size, int(memory_budget_mib * 2**20 // fit_bytes_per_row(n + 1))))
        for start in range(0, len(which), size):
            part = which[start : start + size]
            group = rows[:, : n + 1].contiguous() if len(part) == len(rows) else rows[part, : n + 1]
            for name, value in _fit_rows(group).items():
                out[name][part] = value
    return ProfileFit(**{k: v.float().reshape(alpha.shape[:-1]) for k, v in out.items()})
