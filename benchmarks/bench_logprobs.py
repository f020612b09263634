"""Peak memory and time of the chunked log-prob/entropy pass against the naive (B, T, V) computation.

Forward + backward of (a·log p_y + b·H).sum() w.r.t. hidden and the LM-head weight, fp32, CPU, vocabulary
151,936 (Qwen's), 4 × 1,024 tokens by default. Each method runs in its own subprocess, one after the other:
torch's CPU allocations are invisible to tracemalloc, so the figure is the process's peak RSS
(`resource.getrusage(...).ru_maxrss`) after the timed pass minus its peak after allocating the inputs.
Time is the first forward + backward (there is one pass per process so that the RSS figure stays clean).

Targets: peak-memory ratio (chunked / naive) <= 0.25, time ratio <= 1.3.
Run: `.venv/bin/python benchmarks/bench_logprobs.py [--hidden 512] [--batch 4] [--seq 1024] [--vocab 151936]`;
`--quick` runs the same code at 1 × 128 tokens, V 32,768, H 64 (seconds: what the test suite runs; its ratios mean
nothing). The headline figures are printed as `RATIO <name> <value> TARGET <= <target>` (benchmarks/README.md).
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def run_one(method: str, B: int, T: int, H: int, V: int, threads: int) -> dict:
    import torch

    from klear_lib.logprobs import naive_logprobs_and_entropy, token_logprobs_and_entropy

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(B, T, H, generator=g).requires_grad_()  # (B, T, H)
    weight = (torch.randn(V, H, generator=g) / H**0.5).requires_grad_()  # (V, H)
    labels = torch.randint(0, V, (B, T), generator=g)  # (B, T)
    a, b = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)  # (B, T)
    # Gradient buffers are part of both methods' cost; allocate them before the baseline so the delta is
    # the working memory of the pass itself.
    hidden.grad, weight.grad = torch.zeros_like(hidden), torch.zeros_like(weight)
    fn = token_logprobs_and_entropy if method == "chunked" else naive_logprobs_and_entropy
    base = peak_rss_bytes()
    t0 = time.perf_counter()
    logp, ent = fn(hidden, weight, labels)
    (a * logp + b * ent).sum().backward()
    seconds = time.perf_counter() - t0
    return {"method": method, "seconds": seconds, "peak_delta_bytes": peak_rss_bytes() - base,
            "baseline_bytes": base, "checksum": float(weight.grad.double().abs().sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="tiny sizes, same code path (seconds; the test suite's)")
    ap.add_argument("--child", choices=["chunked", "naive"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.batch, args.seq, args.hidden, args.vocab = 1, 128, 64, 32_768
    shape = (args.batch, args.seq, args.hidden, args.vocab, args.threads)
    if args.child:
        print(json.dumps(run_one(args.child, *shape)))
        return
    res = {}
    for method in ("naive", "chunked"):
        cmd = [sys.executable, __file__, "--child", method, "--batch", str(args.batch), "--seq", str(args.seq),
               "--hidden", str(args.hidden), "--vocab", str(args.vocab), "--threads", str(args.threads)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        res[method] = json.loads(out.strip().splitlines()[-1])
    n, c = res["naive"], res["chunked"]
    print(f"B={args.batch} T={args.seq} (N={args.batch * args.seq}) H={args.hidden} V={args.vocab} fp32 CPU, "
          f"{args.threads} threads, forward+backward")
    for r in (n, c):
        print(f"  {r['method']:8s} time {r['seconds']:7.2f} s   peak RSS delta {r['peak_delta_bytes'] / 2**30:7.3f} GiB"
              f"   (baseline {r['baseline_bytes'] / 2**30:.2f} GiB)")
    # A pass that grew the peak by less than a page (tiny sizes) counts as one page, so the ratio stays defined.
    page = resource.getpagesize()
    mem = max(c["peak_delta_bytes"], page) / max(n["peak_delta_bytes"], page)
    tim = c["seconds"] / n["seconds"]
    print(f"  ratios chunked/naive: memory {mem:.3f} (target <= 0.25), time {tim:.3f} (target <= 1.3)")
    print(f"  weight-grad checksum naive {n['checksum']:.6g} chunked {c['checksum']:.6g}")
    print(f"RATIO logprobs_peak_memory_chunked_over_naive {mem:.3f} TARGET <= 0.25")
    print(f"RATIO logprobs_time_chunked_over_naive {tim:.3f} TARGET <= 1.3")


if __name__ == "__main__":
    main()
