"""Corpus runs at scale: memory and file size flat in the windows, two processes, the reduction, resuming.

Three measurements, each in fresh subprocesses, printed side by side:

1. Memory and file size: ``analyze_corpus`` over N windows of ``--context``
   tokens of the default model with every diagnostic on, for each N of
   ``--windows`` (default 16 and 256): the peak RSS of the analysis (the
   kernel's high-water mark, reset after the model is loaded), the size of the
   saved result (npz + json) and the time. Windows come from the default text;
   when it runs out, further windows are random token ids after BOS (memory
   and file size do not depend on the content).
2. Data parallel: the same ``--parallel-windows`` windows analysed by one
   process with two threads and by two processes (``torchrun``, gloo) with one
   thread each; the wall time of the analysis (after loading; ranks start
   together at a barrier) and the share of it spent in the final reduction of
   the accumulators (the time ``tl_geometry.runs.distributed`` logs).
3. Resume: a run checkpointing every ``--resume-every`` windows is killed
   (SIGKILL) part-way, at a random moment after its first checkpoint, then
   started again: the windows analysed before the kill that the checkpoint
   did not hold (work lost), and whether the resumed result equals an
   uninterrupted run bit for bit.

Run: ``PYTHONPATH=. python benchmarks/bench_corpus.py [--windows 16 256] [--context 1024]``
(``--skip memory parallel resume`` leaves parts out).
Targets: peak RSS at 256 windows at most 1.1x that at 16; result files of the
same size; at most 25 MB for the default report's result; two processes about
as fast as two threads on a 2-core machine, with the reduction under 1 % of
the run; the work lost to an interruption at most one checkpoint interval.
"""

import argparse
import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}


def bench_windows(model, n_windows: int, context: int):
    """``n_windows`` windows of the default text, then random token ids after BOS; and how many are random."""
    import torch

    from tl_geometry import default_text, text_windows

    from_text = text_windows(model, default_text(), context=context)[:n_windows]
    extra = n_windows - len(from_text)
    gen = torch.Generator().manual_seed(0)
    random_rows = torch.randint(10, model.cfg.d_vocab, (max(extra, 0), context), generator=gen)
    random_rows[:, 0] = from_text[0, 0]  # BOS
    return torch.cat([from_text, random_rows]), max(extra, 0)


class _ReductionTime(logging.Handler):
    """Collects the reduction time that tl_geometry.runs.distributed logs."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        self.seconds += getattr(record, "reduction_seconds", 0.0)


def run_parallel(n_windows: int, context: int, batch_size: int, threads: int) -> dict | None:
    """One rank (or the only process) of the data-parallel comparison; rank 0 returns the timings."""
    import torch

    from tl_geometry import analyze_corpus, load_model
    from tl_geometry.runs import distributed

    torch.set_num_threads(threads)
    ranks = distributed.init_from_env("cpu")
    model = load_model(progress=False)
    windows, _ = bench_windows(model, n_windows, context)
    handler = _ReductionTime()
    log = logging.getLogger("tl_geometry.runs.distributed")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    distributed.barrier()  # the ranks start the analysis together
    start = time.perf_counter()
    analyze_corpus(model, windows, batch_size=batch_size, progress=False, diagnostics="all")
    seconds = time.perf_counter() - start
    if ranks.world_size > 1:
        torch.distributed.destroy_process_group()
    if not ranks.is_main:
        return None
    return {"processes": ranks.world_size, "threads": threads, "seconds": seconds, "reduction": handler.seconds}


def run_resume_child(n_windows: int, context: int, checkpoint: str, every: int) -> None:
    """The run that is killed: prints the windows done after every batch (read by the parent)."""
    from tl_geometry import analyze_corpus, load_model
    from tl_geometry.runs import corpus_run as corpus

    model = load_model(progress=False)
    windows, _ = bench_windows(model, n_windows, context)
    original, done = corpus.analyse_prepared, [0]

    def counted(model, batch, *args, **kwargs):
        original(model, batch, *args, **kwargs)
        done[0] += len(batch.tokens)
        print(f"done {done[0]} {time.time()}", flush=True)

    corpus.analyse_prepared = counted
    analyze_corpus(model, windows, batch_size=1, progress=False, checkpoint=checkpoint, checkpoint_every=every)


def run_resume_finish(n_windows: int, context: int, checkpoint: str, every: int) -> dict:
    """Resume the killed run, run it uninterrupted too, and compare every statistic bit for bit."""
    import torch

    from tl_geometry import analyze_corpus, load_model

    model = load_model(progress=False)
    windows, _ = bench_windows(model, n_windows, context)
    saved = torch.load(checkpoint, weights_only=True)["windows_done"]
    start = time.perf_counter()
    resumed = analyze_corpus(model, windows, batch_size=1, progress=False, checkpoint=checkpoint, checkpoint_every=every)
    resume_seconds = time.perf_counter() - start
    whole = analyze_corpus(model, windows, batch_size=1, progress=False)
    same = resumed.n_documents == whole.n_documents and all(
        torch.equal(t.nan_to_num(-7.0), whole.stats[name].arrays()[k].nan_to_num(-7.0))
        for name in whole.fields
        for k, t in resumed.stats[name].arrays().items()
    )
    return {"checkpoint_windows": saved, "resume_seconds": resume_seconds, "identical": same,
            "checkpoint_left": Path(checkpoint).exists()}


def run_size(n_windows: int, context: int, batch_size: int) -> dict:
    from bench_hooks import PeakRSS  # the kernel's high-water mark (this script's folder is on sys.path)

    from tl_geometry import analyze_corpus, load_model

    model = load_model(progress=False)
    windows, extra = bench_windows(model, n_windows, context)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset the high-water mark: the model is loaded, the analysis starts
    before = PeakRSS._high_water_mark()
    start = time.perf_counter()
    result = analyze_corpus(model, windows, batch_size=batch_size, progress=False, diagnostics="all")
    seconds = time.perf_counter() - start
    peak = PeakRSS._high_water_mark()
    with tempfile.TemporaryDirectory() as tmp:
        npz, meta = result.save(Path(tmp) / "result")
        size = npz.stat().st_size + meta.stat().st_size
    return {
        "windows": n_windows,
        "random_windows": max(extra, 0),
        "seconds": seconds,
        "rss_loaded_mib": before / 2**20,
        "rss_peak_mib": peak / 2**20,
        "file_mb": size / 1e6,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def memory_section(args: argparse.Namespace) -> None:
    rows = []
    for n in args.windows:
        out = subprocess.run(
            [sys.executable, __file__, "--size", str(n), "--context", str(args.context), "--batch-size", str(args.batch_size)],
            capture_output=True, text=True, check=True, env=ENV,
        )
        rows.append(_last_json(out.stdout))
    print(f"analyze_corpus, every diagnostic, windows of {args.context} tokens, batch size {args.batch_size}")
    print(f"{'windows':>8}{'random':>8}{'seconds':>9}{'RSS loaded MiB':>16}{'peak MiB':>10}{'file MB':>9}")
    for r in rows:
        print(f"{r['windows']:>8}{r['random_windows']:>8}{r['seconds']:>9.1f}{r['rss_loaded_mib']:>16.0f}"
              f"{r['rss_peak_mib']:>10.0f}{r['file_mb']:>9.2f}")
    small, large = rows[0], rows[-1]
    ratio = large["rss_peak_mib"] / small["rss_peak_mib"]
    print(f"peak RSS x{ratio:.3f} from {small['windows']} to {large['windows']} windows: "
          f"{'met' if ratio <= 1.1 else 'MISSED'} (target x1.1)")
    # Arrays constant along the layer or head axis are stored once (results/storage.py), so the size moves a
    # little with the content; what must not happen is growth with the number of windows.
    growth = large["file_mb"] / small["file_mb"]
    print(f"file size {small['file_mb']:.2f} MB vs {large['file_mb']:.2f} MB (x{growth:.3f}): "
          f"{'flat' if growth <= 1.01 else 'GROWS'} (within 1 %); {'met' if large['file_mb'] <= 25 else 'MISSED'} "
          "(target <= 25 MB)")


def parallel_section(args: argparse.Namespace) -> None:
    worker = [__file__, "--parallel", "--context", str(args.parallel_context), "--batch-size", str(args.parallel_batch_size),
              "--parallel-windows", str(args.parallel_windows)]
    threads = subprocess.run([sys.executable, *worker, "--threads", "2"], capture_output=True, text=True, check=True,
                             env={**ENV, "OMP_NUM_THREADS": "2"})
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_free_port())]
    processes = subprocess.run([*launcher, *worker, "--threads", "1"], capture_output=True, text=True, check=True,
                               env={**ENV, "OMP_NUM_THREADS": "1"})
    one, two = _last_json(threads.stdout), _last_json(processes.stdout)
    print(f"\ndata parallel: {args.parallel_windows} windows of {args.parallel_context} tokens, every diagnostic, "
          f"batch size {args.parallel_batch_size} (after loading)", flush=True)
    print(f"{'':>24}{'seconds':>9}{'windows/s':>11}{'reduction s':>13}{'share':>8}")
    for label, r in (("1 process x 2 threads", one), ("2 processes x 1 thread", two)):
        share = r["reduction"] / r["seconds"]
        print(f"{label:>24}{r['seconds']:>9.1f}{args.parallel_windows / r['seconds']:>11.2f}{r['reduction']:>13.4f}"
              f"{share:>8.2%}")
    share = two["reduction"] / two["seconds"]
    print(f"throughput 2 processes / 2 threads: x{one['seconds'] / two['seconds']:.2f} (about 1 expected on 2 cores); "
          f"reduction {share:.3%} of the run: {'met' if share < 0.01 else 'MISSED'} (target < 1 %)", flush=True)


def resume_section(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = str(Path(tmp) / "run.ckpt")
        common = ["--context", str(args.parallel_context), "--parallel-windows", str(args.resume_windows),
                  "--resume-every", str(args.resume_every), "--checkpoint", checkpoint]
        child = subprocess.Popen([sys.executable, __file__, "--resume-child", *common], stdout=subprocess.PIPE,
                                 text=True, env=ENV)
        done, first_checkpoint = 0, None
        kill_after = random.Random(args.seed).randint(1, args.resume_every)  # windows after the first checkpoint
        for line in child.stdout:
            done = int(line.split()[1])
            if first_checkpoint is None and os.path.exists(checkpoint):
                first_checkpoint = done
            if first_checkpoint is not None and done >= first_checkpoint + kill_after:
                child.send_signal(signal.SIGKILL)
                break
        child.wait()
        child.stdout.close()
        out = subprocess.run([sys.executable, __file__, "--resume-finish", *common], capture_output=True, text=True,
                             check=True, env=ENV)
        r = _last_json(out.stdout)
    lost = done - r["checkpoint_windows"]
    print(f"\nresume: {args.resume_windows} windows of {args.parallel_context} tokens, checkpoint every "
          f"{args.resume_every} windows, SIGKILL after {done} windows")
    print(f"checkpoint held {r['checkpoint_windows']} windows: {lost} windows of work lost: "
          f"{'met' if lost <= args.resume_every else 'MISSED'} (target <= one interval, {args.resume_every}); "
          f"resumed result {'identical to' if r['identical'] else 'DIFFERENT from'} an uninterrupted run; "
          f"checkpoint {'LEFT BEHIND' if r['checkpoint_left'] else 'deleted'} after the run", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, nargs="+", default=[16, 256])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--parallel-windows", type=int, default=16)
    parser.add_argument("--parallel-context", type=int, default=512)
    parser.add_argument("--parallel-batch-size", type=int, default=2)
    parser.add_argument("--resume-windows", type=int, default=24)
    parser.add_argument("--resume-every", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="where the resume run is killed")
    parser.add_argument("--skip", nargs="*", default=[], choices=["memory", "parallel", "resume"])
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--parallel", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--resume-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resume-finish", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.size:
        print(json.dumps(run_size(args.size, args.context, args.batch_size)))
    elif args.parallel:
        timings = run_parallel(args.parallel_windows, args.context, args.batch_size, args.threads)
        if timings is not None:
            print(json.dumps(timings))
    elif args.resume_child:
        run_resume_child(args.parallel_windows, args.context, args.checkpoint, args.resume_every)
    elif args.resume_finish:
        print(json.dumps(run_resume_finish(args.parallel_windows, args.context, args.checkpoint, args.resume_every)))
    else:
        for name, section in (("memory", memory_section), ("parallel", parallel_section), ("resume", resume_section)):
            if name not in args.skip:
                section(args)


if __name__ == "__main__":
    main()
