"""Assumption diagnostics of the paper (sections 3.1-3.3), computed inside the hooked pass.

The value statistics depend on the value states alone (not on a query): they
are computed once per sequence and KV head and copied to the heads of its group.

Definitions (position 0 is the sink; "non-sink" means the real positions i > 0):

- value norms (Assumption 1, Figure 2): ``||v_i||_2`` per position;
  CV = population std / mean of the non-sink norms (NaN with fewer than 2
  non-sink positions); sink ratio lambda = ``||v_0|| / median_{i>0} ||v_i||``,
  with the median of an even count the mean of the two middle values (numpy's).
- cosine by lag (Assumption 2, Figure 3): for each lag k, the mean of
  ``cos(v_i, v_j)`` over all pairs of non-sink positions with ``|i - j| = k``
  (lag 0 is 1 by construction); NaN where no pair has that lag. A zero value
  vector has no direction: it enters with cosine 0 (never seen on real models).
- decay fit: ``exp(-beta * k)`` is fitted to the mean cosine directly (no log,
  since cosines can be <= 0) by least squares over lags ``1..MAX_LAG_FIT`` (the
  paper does not say which lags; fewer where the sequence is shorter), with a
  1-D search over beta on a log grid in ``[BETA_MIN, BETA_MAX]`` followed by a
  finer grid around the best value; ``decay_mae`` is the mean absolute error of
  that fit over the same lags. Each sequence is fitted on its own profile and
  the result averages over sequences; fit the averaged profile with
  `fit_exponential_decay` on ``result.cosine_by_lag`` if preferred.
- rho_0 = mean over non-sink j of ``cos(v_0, v_j)``.
- attention profile (Assumption 3, Figure 4): the attention row of each
  sequence's last analysed query, positions counted from the sink; fitted by
  `tl_geometry.diagnostics.profile_fit.fit_attention_profile`.

Padding: positions count from each row's first real token, so left-padded rows
are shifted left before any statistic; per-position and per-lag outputs are
padded with NaN to ``n_keys``.
"""

import dataclasses
import math
from dataclasses import dataclass

import einops
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from tl_geometry.diagnostics.fields import FieldSpec
from tl_geometry.diagnostics.profile_fit import ProfileFit, fit_attention_profile
from tl_geometry.diagnostics.registry import Diagnostic
from tl_geometry.engine.context import SelectionContext
from tl_geometry.errors import GeometryError

MAX_LAG_FIT = 64  # lags 1..MAX_LAG_FIT enter the decay fit (the paper does not say)
BETA_MIN, BETA_MAX = 1e-4, 10.0  # search range of the decay rate (beta > 0 in Assumption 2)
_COARSE_BETAS, _FINE_BETAS = 161, 81


def _check_values(values: Tensor, real: Tensor) -> None:
    if values.ndim < 2 or real.shape != values.shape[:-1]:
        raise GeometryError(
            f"values, real: expected values [..., pos, d_head] and real [..., pos] with matching leading shape, "
            f"got {list(values.shape)} and {list(real.shape)}"
        )
    if not bool(real[..., 0].all()):
        raise GeometryError("real: position 0 (the sink) must be a real token in every row; shift left-padded rows first")


def _masked_norms(values: Float[Tensor, "*b pos d_head"], real: Bool[Tensor, "*b pos"]) -> Float[Tensor, "*b pos"]:
    norms = torch.linalg.vector_norm(values.float() if values.dtype.itemsize < 4 else values, dim=-1)
    return norms.masked_fill(~real, math.nan)


def _nan_median(x: Float[Tensor, "*b pos"]) -> Float[Tensor, "*b"]:
    """Median over the non-NaN entries, the mean of the two middle ones for an even count (numpy's)."""
    count = (~x.isnan()).sum(-1, keepdim=True)
    ordered = torch.sort(torch.nan_to_num(x, nan=math.inf), dim=-1).values  # NaN (as +inf) sort last
    low = ordered.gather(-1, ((count - 1) // 2).clamp(min=0))
    high = ordered.gather(-1, (count // 2).clamp(max=x.shape[-1] - 1))
    return ((low + high) / 2).squeeze(-1).masked_fill(count.squeeze(-1) == 0, math.nan)


def value_norm_statistics(
    values: Tensor, real: Tensor
) -> tuple[Float[Tensor, "*b pos"], Float[Tensor, "*b"], Float[Tensor, "*b"]]:
    """Value norms by position, CV of the non-sink norms and the sink norm ratio lambda.

    Args:
        values: value states ``[..., pos, d_head]``, position 0 the sink.
        real: real (not padding) positions ``[..., pos]``; position 0 must be real.

    Returns:
        ``(norms [..., pos]`` NaN at padding, ``cv [...]``, ``sink_ratio [...])``:
        CV = population std / mean over the real positions i > 0 (NaN with
        fewer than two), lambda = ``||v_0|| / median_{i>0} ||v_i||``.

    Raises:
        GeometryError: shapes that do not match, or a row whose sink is padding.
    """
    _check_values(values, real)
    norms = _masked_norms(values, real)
    rest = norms[..., 1:]
    count = (~rest.isnan()).sum(-1)
    mean = torch.nanmean(rest, dim=-1)
    std = torch.nanmean((rest - mean.unsqueeze(-1)) ** 2, dim=-1).sqrt()  # population std
    cv = (std / mean).masked_fill(count < 2, math.nan)
    return norms, cv, norms[..., 0] / _nan_median(rest)


def _unit(values: Float[Tensor, "*b pos d_head"], real: Bool[Tensor, "*b pos"]) -> Float[Tensor, "*b pos d_head"]:
    """Unit vectors (float32 at least), zero at padding and for zero vectors."""
    v = values.float() if values.dtype.itemsize < 4 else values
    v = v.masked_fill(~real.unsqueeze(-1), 0.0)
    norms = torch.linalg.vector_norm(v, dim=-1, keepdim=True)
    return torch.where(norms > 0, v / norms.clamp(min=torch.finfo(v.dtype).tiny), 0.0)


def cosine_by_lag(values: Tensor, real: Tensor) -> Float[Tensor, "*b pos"]:
    """Mean cosine similarity of non-sink value states as a function of the lag ``|i - j|``.

    All lags at once by FFT autocorrelation of the unit vectors along positions
    (float32 unless the input is float64; about 1e-6 error, up to 3e-5 at the
    last few lags, which rest on a handful of pairs):
    ``sum_i <u_i, u_{i+k}>`` divided by the number of real pairs at lag k.

    Args:
        values: value states ``[..., pos, d_head]``, position 0 the sink (excluded).
        real: real positions ``[..., pos]``.

    Returns:
        ``[..., pos]``: entry k is the mean cosine at lag k (k = 0..pos-1; 1 at
        lag 0), NaN where no pair of real non-sink positions is k apart.

    Raises:
        GeometryError: shapes that do not match, or a row whose sink is padding.
    """
    _check_values(values, real)
    n_pos = values.shape[-2]
    # float32 FFT unless the input is float64: ~4x faster, error < 1e-6 up to lag 0.9 * pos, ~3e-5 at the last few lags.
    dtype = torch.float64 if values.dtype == torch.float64 else torch.float32
    u = _unit(values[..., 1:, :], real[..., 1:]).to(dtype).transpose(-1, -2)  # [..., d, pos-1]
    mask = real[..., 1:].to(dtype)
    size = 1 << max(1, (2 * n_pos - 1).bit_length())  # zero padding: no circular wrap-around
    spectrum = torch.fft.rfft(u, n=size, dim=-1)
    power = (spectrum.real**2 + spectrum.imag**2).sum(-2)  # sum over d_head: one inverse FFT per row
    sums = torch.fft.irfft(power, n=size, dim=-1)[..., : n_pos - 1]
    mask_spectrum = torch.fft.rfft(mask, n=size, dim=-1)
    counts = torch.fft.irfft(mask_spectrum.real**2 + mask_spectrum.imag**2, n=size, dim=-1)[..., : n_pos - 1].round()
    mean = (sums / counts.clamp(min=1)).masked_fill(counts < 0.5, math.nan).float()
    pad = torch.full((*mean.shape[:-1], 1), math.nan, dtype=mean.dtype, device=mean.device)
    return torch.cat([mean, pad], dim=-1).float()  # lag pos-1 has no non-sink pair


def sink_similarity(values: Tensor, real: Tensor) -> Float[Tensor, "*b"]:
    """rho_0: the mean of ``cos(v_0, v_j)`` over the real positions j > 0 (NaN if there are none).

    Args:
        values: value states ``[..., pos, d_head]``, position 0 the sink.
        real: real positions ``[..., pos]``; position 0 must be real.

    Returns:
        ``[...]``.

    Raises:
        GeometryError: shapes that do not match, or a row whose sink is padding.
    """
    _check_values(values, real)
    u = _unit(values, real)
    count = real[..., 1:].sum(-1)
    total = einops.einsum(u[..., 0, :], u[..., 1:, :], "... d, ... pos d -> ...")
    return (total / count.clamp(min=1)).masked_fill(count == 0, math.nan)


def _decay_sse(
    cosines: Float[Tensor, "... 1 lag"], lags: Float[Tensor, " lag"], betas: Float[Tensor, "... beta 1"]
) -> Float[Tensor, "... beta"]:
    """Squared error of exp(-beta * lag) for each beta (leading axes broadcast); NaN lags are skipped."""
    model = torch.exp(-betas * lags)
    return torch.nansum((cosines - model) ** 2, dim=-1)


def fit_exponential_decay(
    cosines: Tensor, max_lag: int = MAX_LAG_FIT
) -> tuple[Float[Tensor, "*b"], Float[Tensor, "*b"]]:
    """Fit ``exp(-beta * lag)`` to a mean-cosine-by-lag profile; the rate and the mean absolute error.

    Least squares on the cosines themselves (they can be <= 0, so no log),
    over lags ``1..max_lag`` that are not NaN, by a 1-D grid search over beta
    (log grid on ``[BETA_MIN, BETA_MAX]``, then a finer grid around the best
    point): no optimiser that can fail to converge. A fit pinned at
    ``BETA_MAX`` means the cosines are ~0 or negative already at lag 1.

    Args:
        cosines: ``[..., lag]`` with entry k the mean cosine at lag k (as from
            `cosine_by_lag`); entry 0 is ignored.
        max_lag: the largest lag fitted.

    Returns:
        ``(beta [...], mae [...])``; NaN where no lag in ``1..max_lag`` is defined.

    Raises:
        GeometryError: ``max_lag < 1`` or a profile with no lag axis.
    """
    if max_lag < 1:
        raise GeometryError(f"max_lag: expected an integer >= 1, got {max_lag}")
    if cosines.ndim < 1 or cosines.shape[-1] < 2:
        raise GeometryError(f"cosines: expected [..., lag] with at least lags 0 and 1, got {list(cosines.shape)}")
    c = cosines[..., 1 : max_lag + 1].double()
    lags = torch.arange(1, c.shape[-1] + 1, dtype=torch.float64, device=c.device)
    defined = (~c.isnan()).any(-1)
    coarse = torch.logspace(math.log10(BETA_MIN), math.log10(BETA_MAX), _COARSE_BETAS, dtype=torch.float64, device=c.device)
    best = coarse[_decay_sse(c.unsqueeze(-2), lags, coarse[:, None]).argmin(-1)]
    step = (BETA_MAX / BETA_MIN) ** (1 / (_COARSE_BETAS - 1))
    fine = torch.logspace(-1, 1, _FINE_BETAS, base=step, dtype=torch.float64, device=c.device)
    candidates = (best.unsqueeze(-1) * fine).clamp(BETA_MIN, BETA_MAX)  # [..., beta]
    beta = candidates.gather(-1, _decay_sse(c.unsqueeze(-2), lags, candidates.unsqueeze(-1)).argmin(-1, keepdim=True))
    mae = torch.nanmean((c - torch.exp(-beta * lags)).abs(), dim=-1)
    return beta.squeeze(-1).masked_fill(~defined, math.nan).float(), mae.masked_fill(~defined, math.nan).float()


@dataclass(frozen=True)
class AssumptionSettings:
    """Settings of the assumptions diagnostic.

    Attributes:
        max_lag_fit: lags 1..max_lag_fit enter the exponential decay fit (the paper does not say which).
    """

    max_lag_fit: int = MAX_LAG_FIT

    def __post_init__(self) -> None:
        if isinstance(self.max_lag_fit, bool) or not isinstance(self.max_lag_fit, int) or self.max_lag_fit < 1:
            raise GeometryError(f"settings['assumptions'].max_lag_fit: expected an integer >= 1, got {self.max_lag_fit!r}")


def _kv_groups(context: SelectionContext) -> tuple[Tensor, Tensor]:
    """One analysed head per distinct KV head, and for each analysed head the index of its one.

    Under grouped-query attention the heads of a group read the same value
    states, so statistics of the values alone are computed once per group:
    ``stats(values[:, :, first])[:, inverse]``.
    """
    n_heads = len(context.value_heads)
    device = context.value_states.device
    if context.kv_heads is None:
        every = torch.arange(n_heads, device=device)
        return every, every
    groups, inverse = torch.unique(context.kv_heads.to(device), return_inverse=True)
    first = torch.full((len(groups),), n_heads, dtype=torch.long, device=device)
    first.scatter_reduce_(0, inverse, torch.arange(n_heads, device=device), reduce="amin")
    return first, inverse


# The declarations, by name: ``result.per_head(RHO0)`` reads a field as ``result.per_head("rho0")``.
VALUE_NORM_BY_POSITION = FieldSpec("value_norm_by_position", "||v_i|| by position counted from the sink (Figure 2)", ("position",), queries="sequence", documents="mean", bootstrap=True)  # fmt: skip
VALUE_NORM_CV = FieldSpec("value_norm_cv", "CV (population std / mean) of the non-sink value norms (Assumption 1)", queries="sequence", bootstrap=True)  # fmt: skip
SINK_NORM_RATIO = FieldSpec("sink_norm_ratio", "lambda = ||v_0|| / median of the non-sink norms", queries="sequence", bootstrap=True)
RHO0 = FieldSpec("rho0", "rho_0: mean cos(v_0, v_j) over the non-sink positions (Figure 6)", queries="sequence", bootstrap=True)  # fmt: skip
DECAY_BETA = FieldSpec("decay_beta", "beta of the fit exp(-beta lag) to the mean cosine by lag (Assumption 2)", queries="sequence")  # fmt: skip
DECAY_MAE = FieldSpec("decay_mae", "mean absolute error of that fit", queries="sequence", bootstrap=True)
COSINE_BY_LAG = FieldSpec("cosine_by_lag", "mean cos(v_i, v_j) over non-sink pairs |i - j| = lag (Figure 3)", ("lag",), queries="sequence", documents="mean")  # fmt: skip
ATTENTION_PROFILE = FieldSpec("attention_profile", "attention row of the last analysed query by position from the sink (Figure 4)", ("position",), queries="last", documents="mean")  # fmt: skip
CLAIMED_PROFILE = ("p_sink", "p_base", "has_plateau", "has_recency")
PROFILE_FIT = tuple(
    FieldSpec(f"profile_{f.name}", f"four-phase profile fit (Assumption 3): {f.name}", queries="last",
              bootstrap=f.name in CLAIMED_PROFILE)  # the four-phase claim's interval reads these
    for f in dataclasses.fields(ProfileFit)
)
"""The fitted profile's parameters, one field each (``profile_p_sink``, ...), in `ProfileFit`'s order."""
(PROFILE_P_SINK, PROFILE_P_BASE, PROFILE_ETA, PROFILE_OMEGA, PROFILE_T1, PROFILE_T2, PROFILE_ERROR, PROFILE_HAS_PLATEAU,
 PROFILE_HAS_OSCILLATION, PROFILE_HAS_RECENCY) = PROFILE_FIT


class AssumptionDiagnostic(Diagnostic):
    name = "assumptions"
    Settings = AssumptionSettings
    fields = (VALUE_NORM_BY_POSITION, VALUE_NORM_CV, SINK_NORM_RATIO, RHO0, DECAY_BETA, DECAY_MAE, COSINE_BY_LAG,
              ATTENTION_PROFILE, *PROFILE_FIT)

    def sequences(self, context: SelectionContext, settings: AssumptionSettings) -> dict[str, Tensor]:
        """Assumptions 1-3 of one layer, every head and sequence, in slices of sequences within the memory budget.

        The value statistics use the real keys up to the last analysed query
        (every real token with the default ``query_positions="last"``),
        positions counted from the sequence's first real token.
        """
        first, inverse = _kv_groups(context)
        n_keys = context.value_states.shape[1]
        per_sequence = value_statistics_bytes(len(first), n_keys, context.d_head, context.dtype)
        parts = [self._value_statistics(context, first, part, settings)
                 for part in context.sequence_parts(per_sequence)]
        out = {name: torch.cat([p[name] for p in parts])[:, inverse] for name in parts[0]}
        alpha, visible, sink, _ = context.last_query()
        profile = context.from_first_real(alpha.float().masked_fill(~visible[:, None, :], math.nan))
        out["attention_profile"] = profile[..., :n_keys]
        # The profile's position 0 is the sink: where the last query cannot see it (a window has moved
        # past it) there is nothing to fit, and the row, defined only inside the window, is not fitted.
        no_sink = (sink < 0)[:, None, None]
        fits = fit_attention_profile(profile.masked_fill(no_sink, math.nan), context.memory_budget_mib)
        out.update(fits.as_fields("profile_"))
        return out

    @staticmethod
    def _value_statistics(
        context: SelectionContext, first: Tensor, part: slice, settings: AssumptionSettings
    ) -> dict[str, Tensor]:
        """Assumptions 1-2 of the sequences ``part``, one row per KV group (``first``: its analysed head)."""
        values = einops.rearrange(context.value_states[part][:, :, context.value_heads[first]],
                                  "batch key head d_head -> batch head key d_head")
        real = context.from_first_real(context.real[part][:, None, :].float(), part).nan_to_num(0.0).bool()[:, 0]
        values = context.from_first_real(values, part).nan_to_num(0.0)
        real_rows = einops.repeat(real, "batch key -> batch head key", head=values.shape[1])
        norms, cv, ratio = value_norm_statistics(values, real_rows)
        lag_profile = cosine_by_lag(values, real_rows)
        beta, mae = fit_exponential_decay(lag_profile, settings.max_lag_fit)
        return {
            "value_norm_by_position": norms.float(),
            "value_norm_cv": cv.float(),
            "sink_norm_ratio": ratio.float(),
            "rho0": sink_similarity(values, real_rows).float(),
            "decay_beta": beta,
            "decay_mae": mae,
            "cosine_by_lag": lag_profile,
        }


def value_statistics_bytes(n_groups: int, n_keys: int, d_head: int, dtype: torch.dtype) -> int:
    """Working memory of Assumptions 1-2 per sequence, in bytes (an upper bound), for values of ``dtype``.

    Per KV group, in float32 at least: the values' copies (sliced, shifted to
    the sink, unit vectors: up to 10 of ``[key, d_head]``) and the
    autocorrelation's spectrum with its squares (2 x the FFT length per
    d_head); tests/test_diagnostics_memory.py measures it.
    """
    fft = 1 << max(1, (2 * n_keys - 1).bit_length())
    return max(4, dtype.itemsize) * n_groups * d_head * (2 * fft + 10 * n_keys)


DIAGNOSTIC = AssumptionDiagnostic()
