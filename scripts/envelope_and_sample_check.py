"""SmolLM2-135M on few windows: what the upper envelopes bound, and the claims' verdicts by sample size.

    PYTHONPATH=. python scripts/envelope_and_sample_check.py [context]

For 2, 4, 8 and 16 windows of ``context`` tokens (default 256) of the
bundled text, every diagnostic: the (row, N) cells at 1 < N < L whose
measured P or R lies above the theorem's upper envelope (rows re-drawn) and
above the realised bound (the measured row's), the tightness statistic
against the floor and read literally, and the claims whose verdict comes
from a point estimate outside its own interval (must be 0) or reads
"too few documents". Prints what docs/claims.md records.
"""

import math
import sys
import time

import torch

import tl_geometry as tg
import tl_geometry.analysis.claims
from tl_geometry.analysis.envelopes import upper_envelope_facts


WINDOWS = (2, 4, 8, 16)


def main(context: int = 256) -> None:
    model = tg.load_model(progress=False)
    text = tg.default_text()
    for windows in WINDOWS:
        start = time.perf_counter()
        tokens = tg.text_windows(model, text, context=context, n_windows=windows)
        result = tg.run_with_geometry_hooks(model, tokens, diagnostics="all", keep_queries=True)
        q = result.queries
        inner = (result.n_grid > 1) & (result.n_grid < context)
        line = [f"{windows} x {context}: {time.perf_counter() - start:.0f} s"]
        for metric in ("precision", "recall"):
            m, up, real = (q[name][..., inner] for name in (metric, f"bound_{metric}_upper", f"bound_{metric}_realised"))
            ok = ~m.isnan()
            line.append(f"{metric}: above the theorem envelope {int((m > up)[ok].sum())}/{int(ok.sum())} cells "
                        f"(all with value 1: {bool((m[(m > up) & ok] == 1).all())}); above the realised bound "
                        f"{int((m > real)[ok].sum())}")
        facts = upper_envelope_facts(result)
        p = facts.precision_exceeded
        line.append(f"per head, P above at 1 < N < L: median {float(p.nanmedian()):.3f}, "
                    f"largest {float(p[~p.isnan()].max()):.3f}")
        table = tg.claims(result)
        resolved = table[table.verdict.isin(["holds", "partly", "does not hold"])]
        outside = [k for k, r in resolved.iterrows()
                   if not math.isnan(r.low) and not (r.low - 1e-6 <= r.value <= r.high + 1e-6)]
        line.append(f"verdicts from an estimate outside its interval: {len(outside)} {outside}; "
                    f"too few documents: {int((table.verdict == 'too few documents').sum())}; "
                    f"resolved: {dict(resolved.verdict)}")
        line.append("tightness: " + table.loc["envelope_tightness", "measured"][:400])
        for key, row in table[table.literal_verdict.fillna("") != ""].iterrows():
            line.append(f"{key}: ours {row.value:.3g} {row.verdict}; read {row.literal}: {row.literal_value:.3g} "
                        f"[{row.literal_low:.3g}, {row.literal_high:.3g}] {row.literal_verdict}")
        line.append("first screen: " + (tg.analysis.claims.sample_warning(result.n_documents) or "(no warning)"))
        print("\n  ".join(line), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
