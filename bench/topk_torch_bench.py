#!/usr/bin/env python3
"""torch.topk of |x| for the sizes of topk_cuda_bench, on the device PyTorch
has: the peer the CUDA top-k is compared with where PyTorch has CUDA.

    python3 bench/topk_torch_bench.py [--device=auto|cuda|cpu] [--repeats=N]

Prints the PyTorch build, whether it has CUDA, and one Markdown table (median
of --repeats runs; CUDA events on the device, wall time on the CPU). Debian's
python3-torch is a CPU build: there --device=auto measures the CPU, and
--device=cuda says so and exits 1.
"""

import argparse
import statistics
import sys
import time

import torch

SIZES = (1_000_000, 25_000_000, 100_000_000)
DENSITIES = (0.001, 0.01)


def timed_ms(fn, device, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            begin = time.perf_counter()
            fn()
            times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto",
                        choices=("auto", "cuda", "cpu"))
    parser.add_argument("--repeats", type=int, default=0,
                        help="runs per figure (default 20 on CUDA, 3 on "
                        "the CPU)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="comma-separated value counts")
    args = parser.parse_args()
    has_cuda = torch.cuda.is_available()
    print(f"torch {torch.__version__}, built with CUDA "
          f"{torch.version.cuda or 'no'}, device available: {has_cuda}")
    if args.device == "cuda" and not has_cuda:
        print("topk_torch_bench: --device=cuda: this PyTorch has no usable "
              "CUDA device", file=sys.stderr)
        return 1
    use_cuda = args.device == "cuda" or (args.device == "auto" and has_cuda)
    device = torch.device("cuda" if use_cuda else "cpu")
    repeats = args.repeats or (20 if use_cuda else 3)
    name = (torch.cuda.get_device_name(device) if use_cuda
            else f"CPU, {torch.get_num_threads()} threads")
    print(f"device: {name}\n")
    print("| n | density | torch.topk(abs) ms | abs + read ms |")
    print("|---|---|---|---|")
    generator = torch.Generator(device=device).manual_seed(1)
    for n in (int(s) for s in args.sizes.split(",")):
        x = torch.randn(n, device=device, generator=generator)
        read = timed_ms(lambda: x.abs().sum(), device, repeats)
        for density in DENSITIES:
            k = max(1, int(n * density))
            ms = timed_ms(lambda: torch.topk(x.abs(), k, sorted=False),
                          device, repeats)
            print(f"| {n} | {density * 100:.1f}% | {ms:.3f} | {read:.3f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
