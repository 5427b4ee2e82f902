"""Every public path is linear in its input: the work at 10x the size is about 10x, never 100x.

Each case (tests/scaling_cases.py) builds an adversarial input of n tokens for one state of the
parser (or one path of the mapping). The work done is counted, not timed: every function call,
Python's and C's, made at n and at 10n. The count is the same on any machine under any load, so
the bound is exact; a quadratic path in Python shows as ~100x. The times of the same cases, which
also see quadratic work inside one C call, are make bench's (benchmarks/scaling.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from scaling_cases import CASES, MAPPING_INPUTS, MAPPINGS, PATHS, SIZE, SIZES, stream

BOUND = 14  # linear is 10-11 (a constant part shrinks the ratio, bookkeeping grows it); quadratic ~100


def calls(fn: Callable[[], object]) -> int:
    """The function calls ``fn`` makes (Python and C): a count of work that no load changes."""
    count = 0

    def counter(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(counter)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def ratio(make: Callable[[int], list[int]], run: Callable[[list[int]], object], n: int) -> float:
    small, large = make(n), make(10 * n)
    run(small)  # caches filled (headers, token strings) before counting
    run(large)
    return calls(lambda: run(large)) / max(calls(lambda: run(small)), 1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_parser_is_linear(case: str) -> None:
    r = ratio(CASES[case], PATHS["parse"], SIZES.get(case, SIZE))
    assert r < BOUND, f"{case}: 10x the tokens made {r:.1f}x the calls"


@pytest.mark.parametrize("case", sorted(CASES))
def test_stream_is_linear(case: str) -> None:
    """Token by token, every state's work is in Python: where the batch path does a case in a
    few C calls (a body decoded in one run), this counts what each token costs."""
    r = ratio(CASES[case], stream, SIZES.get(case, SIZE))
    assert r < BOUND, f"{case}: 10x the tokens made {r:.1f}x the calls"


@pytest.mark.parametrize("path", sorted(MAPPINGS))
@pytest.mark.parametrize("make", sorted(MAPPING_INPUTS))
def test_mapping_is_linear(path: str, make: str) -> None:
    r = ratio(MAPPING_INPUTS[make], MAPPINGS[path], SIZE)
    assert r < BOUND, f"{path} ({make}): 10x the tokens made {r:.1f}x the calls"
