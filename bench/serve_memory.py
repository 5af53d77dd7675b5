"""Resident memory of a started full-attention engine under rounds of varied concurrent requests.

Reproduces docs/BENCHMARKS.md, "Serving", the memory paragraph. Each round sends 25 batches of
1-8 concurrent requests (one thread each, through the engine's background loop, as the server
does), with prompts of 1-19 words and max_tokens drawn from {8, 16, 24, 32, 40, 48, 64, 96}; the
same seeded sequence every run. It prints the process's RSS after each round and the round's
completion tokens per second; the last line is after glibc's ``malloc_trim(0)``, for what the
allocator merely holds.

    python bench/serve_memory.py --model models/celeris-tiny --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import ctypes
import random
import sys
import threading
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import celeris  # noqa: E402
from celeris.request_params import request_params  # noqa: E402

WORDS = ("Once upon a time there was a little cat who liked to play in the garden with a red "
         "ball").split()
LENGTHS = [8, 16, 24, 32, 40, 48, 64, 96]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/celeris-tiny")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=25, help="batches per round")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    engine = celeris.Engine.from_pretrained(a.model, device="cpu").start()
    proc, rng, lock, tokens = psutil.Process(), random.Random(0), threading.Lock(), [0]

    def one(seed: int, n: int, gen: int) -> None:
        params = request_params({"max_tokens": gen, "seed": seed}, engine.default_params())
        result = engine.generate(" ".join(WORDS[:n]), params)
        with lock:
            tokens[0] += result.usage.completion_tokens

    def rss() -> float:
        return proc.memory_info().rss / 2 ** 20

    print(f"started: {rss():.0f} MB", flush=True)
    for rnd in range(a.rounds):
        start, tokens[0] = time.perf_counter(), 0
        for batch in range(a.batches):
            draws = [(rnd * 1000 + batch * 10 + j, rng.randint(1, len(WORDS)), rng.choice(LENGTHS))
                     for j in range(rng.randint(1, 8))]
            threads = [threading.Thread(target=one, args=draw) for draw in draws]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        took = time.perf_counter() - start
        print(f"round {rnd + 1}: {rss():.0f} MB, {tokens[0]} tokens in {took:.1f} s, "
              f"{tokens[0] / took:.1f} tok/s", flush=True)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        print(f"after malloc_trim: {rss():.0f} MB")
    except (OSError, AttributeError):
        pass
    engine.stop()


if __name__ == "__main__":
    main()
