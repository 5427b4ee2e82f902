"""`make bench`: the parser and the mapping are linear in time, too (reported, not asserted).

tests/test_scaling.py counts the calls each case makes at n and 10n, which no load changes;
this times the same cases (tests/scaling_cases.py), which also sees quadratic work inside a
single C call (a regex over a growing text, a growing string copied). Linear is ~10-16x
(allocation grows a little with size), quadratic ~100x: a ratio over 40 is flagged.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from scaling_cases import CASES, MAPPING_INPUTS, MAPPINGS, PATHS, SIZE, SIZES, stream

FLAG = 40


def best(fn: Callable[[], object], repeat: int) -> float:
    # The collector off while timing: its full passes scale with the heap, not the algorithm.
    times = []
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        finally:
            gc.enable()
    return min(times)


def ratio(make: Callable[[int], list[int]], run: Callable[[list[int]], object], n: int) -> tuple[float, float]:
    small, large = make(n), make(10 * n)
    run(small)
    t_small, t_large = best(lambda: run(small), 5), best(lambda: run(large), 3)
    return t_large, t_large / max(t_small, 1e-6)


def main() -> None:
    print("linearity: time at 10x the tokens over the time at 1x (linear ~10-16x, quadratic ~100x)")
    rows = [(f"parse {c}", CASES[c], PATHS["parse"], SIZES.get(c, SIZE)) for c in sorted(CASES)]
    rows += [(f"stream {c}", CASES[c], stream, SIZES.get(c, SIZE)) for c in sorted(CASES)]
    rows += [(f"{p} {m}", MAPPING_INPUTS[m], MAPPINGS[p], SIZE) for p in sorted(MAPPINGS)
             for m in sorted(MAPPING_INPUTS)]
    worst = 0.0
    for name, make, run, n in rows:
        t, r = ratio(make, run, n)
        worst = max(worst, r)
        print(f"  {name:<40} {10 * n:>7} tokens {t * 1e3:9.2f} ms   {r:6.1f}x{'   OVER ' + str(FLAG) if r > FLAG else ''}")
    print(f"  worst ratio {worst:.1f}x (flagged over {FLAG}x)")


if __name__ == "__main__":
    main()
