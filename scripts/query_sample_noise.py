"""How much of the role features' noise is the query sample: the same windows with 8 and with 32 query positions.

    PYTHONPATH=. python scripts/query_sample_noise.py [--windows 8] [--context 256] [--model smollm2-135m]

Prints the label counts and the time of each, and per role feature the median ratio of the bootstrap standard
errors SE(32) / SE(8) over the heads: 0.50 if all the noise were the query sample (four times the rows), 1.00 if
all of it were the documents (the same windows). docs/circuits.md, "What the uncertainty is made of".
"""

import argparse
import time

import tl_geometry as tg
from tl_geometry.analysis.head_roles import role_counts, roles_from_result
from tl_geometry.diagnostics.role_features import ROLE_FEATURES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--windows", type=int, default=8)
    parser.add_argument("--context", type=int, default=256)
    args = parser.parse_args()
    model = tg.load_model(args.model, progress=False)
    windows = tg.text_windows(model, tg.default_text(), context=args.context, n_windows=args.windows)
    roles = {}
    for n_queries in (8, 32):
        start = time.perf_counter()
        config = tg.GeometryConfig(diagnostics=["roles"]).with_overrides(settings={"roles": {"n_queries": n_queries}})
        result = tg.analyze_corpus(model, windows, config, batch_size=1, progress=False)
        roles[n_queries] = roles_from_result(result)
        print(f"{n_queries} queries per window: {time.perf_counter() - start:.0f} s, {role_counts(roles[n_queries])}", flush=True)
    for name in ROLE_FEATURES:
        few, many = roles[8].se[name], roles[32].se[name]
        kept = (few > 0) & few.isfinite() & many.isfinite()
        print(f"{name}: median SE(32) / SE(8) {float((many / few)[kept].median()):.2f}")


if __name__ == "__main__":
    main()
