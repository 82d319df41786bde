"""Cost of the geometry hooks: bare forward vs run_with_geometry_hooks vs run_with_cache + engine.

The hooks of the pattern path (``capture="pattern"``) against the bridge's
bare eager forward; the rows path, the default where the model allows it, is
measured by ``benchmarks/bench_rows.py``.

One 1024-token window of the default model (``tl_geometry.models.load_model``,
SmolLM2-135M) if it is available, else a tiny random Llama with GQA of the same
shape (30 layers x 9 heads x 3 KV heads x d_head 64) built from a config. Each
mode runs in a fresh subprocess so that peak memories do not mask each other,
and the modes take turns for a few rounds. In each process: short warm-up
passes, one pass of the mode for its peak RSS (the kernel's high-water mark,
see `PeakRSS`), then timed passes of the mode alternating with bare passes.
Every time ratio pairs a pass with the bare pass just before it, seconds
apart, and the table gives the median over the pairs: on a shared machine
whose speed drifts by 10 % or more from minute to minute, pooled medians of
separate processes moved the hooks' ratio between 0.89 and 1.25.

Run: ``PYTHONPATH=. python benchmarks/bench_hooks.py [--rounds 3] [--repeats 3] [--context 1024]``.
Modes: bare forward; hooks (selection metrics); all (metrics plus every
diagnostic: Assumptions 1-3, bounds, role features, chance baselines);
all-but-chance (every diagnostic but the random controls); cache (the by-hand
way); assumptions, bounds, roles, chance (the metrics plus that one
diagnostic: the column "own x bare" is its cost beyond the metrics). The
time the geometry adds is also clocked directly: inside the hooks, part by
part (the selection context, each diagnostic), and around the model's
forward pass (tokens, accumulator, result); "clocked x bare" is their sum
over the bare pass just before. A difference of two noisy passes, as "own x bare"
is, can even come out below zero on a shared machine; a clock around the
work itself cannot, so that column is the steadier figure of the two.
Targets: hooks (one shared selection context per layer) add at most 5 % to
the bare forward time, all diagnostics at most 20 %, the roles diagnostic (with its
query sample for the head roles) at most 25 % on top of the hooks; the first two at most 5 % to its
peak RSS. The second is missed by construction since the random controls
came: see "What the diagnostics cost" in docs/scale.md.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

# One diagnostic on top of the metrics: its own cost is the difference with "hooks".
ONE_DIAGNOSTIC = ("assumptions", "bounds", "roles", "chance")
ALL_BUT_CHANCE = ["assumptions", "bounds", "roles"]
MODES = ("bare", "hooks", "all", "all-but-chance", "cache", *ONE_DIAGNOSTIC)


def build_model():
    """The default model, or a stand-in of the same shape; and a description."""
    try:
        from tl_geometry.models import load_model

        return load_model("smollm2-135m", kind="bridge", progress=False), "smollm2-135m (TransformerBridge)"
    except Exception as err:  # noqa: BLE001 -- report why and fall back
        import transformers
        from transformer_lens.model_bridge import TransformerBridge

        from tests.tiny_models import tiny_tokenizer

        config = transformers.LlamaConfig(
            vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
            num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
            bos_token_id=0, eos_token_id=0, pad_token_id=1,
        )
        hf_model = transformers.AutoModelForCausalLM.from_config(config).eval()
        bridge = TransformerBridge.boot_transformers("random-llama-30x9", hf_model=hf_model, tokenizer=tiny_tokenizer())
        for p in bridge.parameters():
            p.requires_grad_(False)
        return bridge.eval(), f"random Llama 30x9 heads, 3 KV heads, d_head 64 (default model unavailable: {err!r})"


class PeakRSS:
    """Peak resident set size while inside the ``with`` block.

    On Linux, the kernel's own high-water mark: reset on entry (``5`` to
    ``/proc/self/clear_refs``) and read on exit (``VmHWM``), exact and free.
    Elsewhere a psutil thread samples RSS every millisecond; that thread
    competes for the GIL and a core, which slows Python-heavy code more than
    the model's large kernels, so time measured beside it is less fair.
    """

    def __init__(self):
        import psutil

        self.process = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = None

    @staticmethod
    def _high_water_mark() -> int:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        raise OSError("no VmHWM in /proc/self/status")

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.001)

    def __enter__(self):
        self.peak = self.process.memory_info().rss
        try:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")
            self._high_water_mark()
        except OSError:
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread is None:
            self.peak = max(self.peak, self._high_water_mark())
            return
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def run_mode(mode: str, repeats: int, context: int) -> dict:
    import torch

    from tl_geometry.capture.hook_names import pattern_hook, value_hook
    from tl_geometry.capture.hooks import run_with_geometry_hooks
    from tl_geometry.engine.metrics import selection_metrics
    from tl_geometry.engine.grid import default_n_grid

    torch.manual_seed(0)
    model, description = build_model()
    vocab = model.cfg.d_vocab
    tokens = torch.randint(10, vocab, (1, context))
    tokens[0, 0] = model.tokenizer.bos_token_id if model.tokenizer.bos_token_id is not None else 0
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    n_kv = getattr(model.cfg, "n_key_value_heads", None) or n_heads

    def bare(t):
        with torch.inference_mode():
            model(t, return_type=None)

    # The pattern path: the hooks on the bridge's eager pass, what "bare" runs (benchmarks/bench_rows.py: the rows).
    def hooks(t):
        run_with_geometry_hooks(model, t, capture="pattern")

    def all_diagnostics(t):  # Assumptions 1-3, bounds and role features in the same pass
        run_with_geometry_hooks(model, t, diagnostics="all", capture="pattern")

    def cache(t):  # the by-hand way: cache every value and pattern, then the engine per layer
        names = {value_hook(l) for l in range(n_layers)} | {pattern_hook(l) for l in range(n_layers)}
        with torch.inference_mode():
            _, c = model.run_with_cache(t, names_filter=lambda n: n in names)
            grid = default_n_grid(t.shape[1])
            for layer in range(n_layers):
                v = c[value_hook(layer)][:, :, torch.arange(n_heads) // (n_heads // n_kv)]  # [b, pos, h, d]
                alpha = c[pattern_hook(layer)][:, :, -1]  # [b, h, key]
                selection_metrics(alpha, v.transpose(1, 2), grid)

    def one(name):  # the metrics plus one diagnostic: its own cost is the difference with "hooks"
        return lambda t: run_with_geometry_hooks(model, t, diagnostics=[name], capture="pattern")

    parts: dict[str, float] = {}
    if mode not in ("bare", "cache"):
        _clock_parts(parts, model)
    fns = {"bare": bare, "hooks": hooks, "all": all_diagnostics, "cache": cache,
           "all-but-chance": lambda t: run_with_geometry_hooks(model, t, diagnostics=ALL_BUT_CHANCE, capture="pattern")}
    fn = fns[mode] if mode in fns else one(mode)
    fn(tokens[:, :32])  # warm-up
    bare(tokens[:, :32])
    with PeakRSS() as peak:  # memory: one pass of this mode alone
        baseline = peak.peak
        fn(tokens)
    # Time: passes of this mode and bare passes taking turns in this process, each pair seconds apart.
    times, bare_times, part_times = [], [], []
    for _ in range(repeats):
        for f, out in ((bare, bare_times), (fn, times)) if mode != "bare" else ((fn, times),):
            parts.clear()
            start = time.perf_counter()
            f(tokens)
            out.append(time.perf_counter() - start)
        if "forward" in parts:  # the work of run_with_geometry_hooks around the model's forward pass
            parts["outside the forward"] = times[-1] - parts.pop("forward")
            parts["geometry (all)"] = parts["hooks"] + parts["outside the forward"]
        part_times.append(dict(parts))
    return {
        "mode": mode,
        "model": description,
        "context": context,
        "seconds": times,
        "bare_seconds": bare_times or times,
        "parts": part_times,
        "rss_before_mib": baseline / 2**20,
        "rss_peak_mib": peak.peak / 2**20,
        "threads": torch.get_num_threads(),
    }


def _clock_parts(parts: dict[str, float], model) -> None:
    """Add the wall time of each part to ``parts``: the model's forward, the hooks, the context, each diagnostic."""
    from tl_geometry.capture import layer_analysis
    from tl_geometry.diagnostics.registry import REGISTRY
    from tl_geometry.engine.context import SelectionContext

    def clocked(owner, method: str, label: str) -> None:
        inner = getattr(owner, method)

        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                parts[label] = parts.get(label, 0.0) + time.perf_counter() - start

        setattr(owner, method, run)

    def forward_started(module, args):
        parts["_started"] = time.perf_counter()

    def forward_ended(module, args, output):
        parts["forward"] = parts.get("forward", 0.0) + time.perf_counter() - parts.pop("_started")

    model.register_forward_pre_hook(forward_started)
    model.register_forward_hook(forward_ended)
    clocked(layer_analysis.LayerAnalysis, "value_hook", "hooks")
    clocked(layer_analysis.LayerAnalysis, "pattern_hook", "hooks")
    clocked(SelectionContext, "_chunk", "selection context")
    for name in REGISTRY.names():
        diagnostic = REGISTRY.get(name)
        clocked(diagnostic, "rows", name)
        clocked(diagnostic, "sequences", name)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def _clocked_share(row: dict) -> float | None:
    """Median over a mode's passes of the geometry's clocked time over the bare pass just before; None if unclocked."""
    if not row["parts"] or not row["parts"][0]:
        return None
    return _median([p["geometry (all)"] / b for p, b in zip(row["parts"], row["bare_seconds"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed pairs (bare, mode) per mode and round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every mode, interleaved (machine noise)")
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--modes", nargs="*", choices=MODES, default=list(MODES), help="modes to run (default: all)")
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.repeats, args.context)))
        return
    # Modes take turns, round after round (each in a fresh process, so that peak memories do not mask each
    # other); within a process the mode's passes alternate with bare passes, and each ratio pairs a pass
    # with the bare pass just before it, so that the machine's slower spells hit both.
    rows: dict[str, dict] = {}
    for _ in range(args.rounds):
        for mode in args.modes:
            out = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--repeats", str(args.repeats), "--context", str(args.context)],
                capture_output=True, text=True, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
            r = json.loads(out.stdout.strip().splitlines()[-1])
            r["ratios"] = [t / b for t, b in zip(r["seconds"], r["bare_seconds"])]
            if mode not in rows:
                rows[mode] = r
            else:
                for key in ("seconds", "bare_seconds", "ratios", "parts"):
                    rows[mode][key] += r[key]
                rows[mode]["rss_peak_mib"] = max(rows[mode]["rss_peak_mib"], r["rss_peak_mib"])
    bare = rows["bare"]
    ratio = {mode: _median(r["ratios"]) for mode, r in rows.items()}
    print(f"model: {bare['model']}; one window of {bare['context']} tokens; {bare['threads']} torch threads; "
          f"{args.rounds} rounds x {args.repeats} pairs of passes per mode")
    print("x bare: median over pairs of (pass / the bare pass just before it); min x bare: fastest pass / fastest "
          "bare pass of the same processes; own x bare: x bare minus that of hooks; clocked x bare: the geometry's "
          "own time, clocked around its work, over the bare pass just before (median)")
    print(f"{'mode':<15}{'median s':>10}{'min s':>9}{'x bare':>8}{'min x bare':>11}{'own x bare':>11}{'clocked x bare':>16}"
          f"{'RSS before MiB':>16}{'peak MiB':>10}{'peak x bare':>12}{'extra MiB':>10}")
    for mode, r in rows.items():
        own = f"{ratio[mode] - ratio['hooks']:.2f}" if mode in ONE_DIAGNOSTIC and "hooks" in rows else ""
        share = _clocked_share(r)
        inside = "" if share is None else f"{share:.3f}"
        print(
            f"{mode:<15}{_median(r['seconds']):>10.3f}{min(r['seconds']):>9.3f}{ratio[mode]:>8.2f}"
            f"{min(r['seconds']) / min(r['bare_seconds']):>11.2f}{own:>11}{inside:>16}"
            f"{r['rss_before_mib']:>16.0f}{r['rss_peak_mib']:>10.0f}{r['rss_peak_mib'] / bare['rss_peak_mib']:>12.2f}"
            f"{r['rss_peak_mib'] - r['rss_before_mib']:>10.0f}"
        )
    if "all" in rows:
        r = rows["all"]
        print("the passes with every diagnostic on, clocked part by part: each part's median time over the passes, "
              "and the median of its share of the bare pass just before:")
        for part in r["parts"][0]:
            seconds = [p[part] for p in r["parts"]]
            share = [p[part] / b for p, b in zip(r["parts"], r["bare_seconds"])]
            print(f"  {part:<20}{_median(seconds):>8.3f} s{_median(share):>8.3f} x bare")
    for mode, limit in (("hooks", 1.05), ("all", 1.2), ("all-but-chance", 1.2)):
        if mode not in rows:
            continue
        time_ok = ratio[mode] <= limit
        mem_ok = rows[mode]["rss_peak_mib"] <= 1.05 * bare["rss_peak_mib"]
        clocked = 1 + _clocked_share(rows[mode])
        print(f"targets for {mode}: time x{limit} (paired median) {'met' if time_ok else 'MISSED'}, "
              f"(clocked: x{clocked:.3f}, {'met' if clocked <= limit else 'MISSED'}), "
              f"peak memory x1.05 {'met' if mem_ok else 'MISSED'}")
    if "roles" in rows and "hooks" in rows:  # the roles' query sample: at most a quarter of a bare pass
        own = ratio["roles"] - ratio["hooks"]
        clocked = _clocked_share(rows["roles"]) - _clocked_share(rows["hooks"])
        print(f"target for the roles diagnostic (its query sample, on top of the metrics): +0.25 x bare: paired "
              f"{own:+.3f} {'met' if own <= 0.25 else 'MISSED'}, clocked {clocked:+.3f} {'met' if clocked <= 0.25 else 'MISSED'}")


if __name__ == "__main__":
    main()
