"""Benchmark the bucket planner against powers of two and evenly spaced buckets.

Prompt lengths in chat and RAG traffic are skewed: most are short, a long tail
reaches the context limit. This draws a seeded log-normal sample (lengths over
the model maximum are redrawn, as a server would reject them), then for several
bucket counts K prints the padding waste of the exact plan, of the NxDI
powers-of-two ladder with K buckets, and of K evenly spaced buckets, for single
requests and for batches; and how long the planner took, here and on the
worst case (every length up to the maximum distinct).

    python tools/bench/bench_buckets.py [--samples 200000] [--seed 0] [--batch 8]
    python tools/bench/bench_buckets.py --quick     # CI smoke run: checks it works, not its figures
"""

from __future__ import annotations

import argparse
import random
import time

from warmcache.buckets import LengthDistribution, Traffic, plan_fixed
from warmcache.buckets.baselines import evenly_spaced, powers_of_two, powers_of_two_count


def lognormal_lengths(samples: int, seed: int, mu: float, sigma: float, max_length: int) -> list[int]:
    rng = random.Random(seed)
    out: list[int] = []
    while len(out) < samples:
        length = int(round(rng.lognormvariate(mu, sigma)))
        if 1 <= length <= max_length:
            out.append(length)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mu", type=float, default=5.5, help="log-normal mu (median length e^mu, ~245 tokens)")
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--max-length", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--ks", default="2,3,4,6,8,12")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="A smoke run in about a second (CI): 5,000 samples, K = 2 and 4, lengths up to 1024.",
    )
    args = parser.parse_args()
    if args.quick:
        args.samples, args.ks, args.max_length = 5_000, "2,4", 1024

    lengths = LengthDistribution.from_lengths(
        lognormal_lengths(args.samples, args.seed, args.mu, args.sigma, args.max_length)
    )
    print(
        f"log-normal(mu={args.mu}, sigma={args.sigma}), seed {args.seed}: {lengths.total} lengths, "
        f"{len(lengths.values)} distinct, {lengths.min_length}-{lengths.max_length}, mean {lengths.mean_length:.1f}"
    )
    ks = [int(k) for k in args.ks.split(",")]
    for batch in (1, args.batch):
        traffic = Traffic(lengths, batch)
        weights = traffic.planner_weights
        title = "single requests" if batch == 1 else f"batches of {batch} (buckets on the batch maximum)"
        unavoidable = traffic.cost(lengths.values).waste_percent
        print(
            f"\n{title}; waste % = padded / computed tokens"
            + (f"; unavoidable with every length compiled: {unavoidable:.2f}%" if batch > 1 else "")
        )
        print(
            f"{'K':>3}  {'DP':>7}  {'pow2':>7}  {'even':>7}  {'DP pad/req':>10}  {'pow2 pad/req':>12} "
            f" {'DP ms':>7}  DP buckets"
        )
        for k in ks:
            started = time.perf_counter()
            plan = plan_fixed(lengths.values, weights, k)
            elapsed_ms = 1000 * (time.perf_counter() - started)
            dp, pow2, even = (
                traffic.cost(b)
                for b in (
                    plan.buckets,
                    powers_of_two_count(lengths.max_length, k),
                    evenly_spaced(lengths.max_length, k),
                )
            )
            print(
                f"{k:>3}  {dp.waste_percent:>7.2f}  {pow2.waste_percent:>7.2f}  {even.waste_percent:>7.2f}  "
                f"{dp.padded_tokens_per_request:>10.1f}  {pow2.padded_tokens_per_request:>12.1f}  "
                f"{elapsed_ms:>7.1f}  {list(plan.buckets)}"
            )
        ladder = powers_of_two(lengths.max_length)
        same = plan_fixed(lengths.values, weights, len(ladder))
        print(
            f"NxDI ladder from 128 ({len(ladder)} buckets): {traffic.cost(ladder).waste_percent:.2f}% waste; "
            f"DP with {len(ladder)} buckets: {traffic.cost(same.buckets).waste_percent:.2f}%"
        )

    # Worst case for the planner: every length up to the maximum observed once.
    every = list(range(1, args.max_length + 1))
    print()
    for k in (8, 64):
        started = time.perf_counter()
        plan_fixed(every, [1] * len(every), k)
        print(f"planner runtime, {len(every)} distinct lengths, K={k}: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
