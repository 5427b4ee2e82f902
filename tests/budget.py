"""How hard hypothesis looks: one place for every property test's budget.

``conftest.py`` picks a profile before any test module is imported:

- ``ci`` (when ``CI=true``, as ``.ci/run`` runs): derandomized, so a run is the same run
  every time and CI never turns red by chance; no example database;
- ``dev`` (the default): random, as hypothesis is, with its database of failures;
- ``fuzz`` (``make fuzz``, ``HARMONYKIT_FUZZ=N``): random, N times each test's examples.

A test states its budget with ``examples(n)``; the fuzz profile multiplies it, since a
test's own ``max_examples`` would otherwise override any profile.
"""

from __future__ import annotations

import os
from typing import Any

from hypothesis import HealthCheck, settings

FACTOR = max(1, int(os.environ.get("HARMONYKIT_FUZZ", "1") or 1))
PROFILE = "fuzz" if FACTOR > 1 else "ci" if os.environ.get("CI", "").lower() == "true" else "dev"

settings.register_profile("ci", derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.register_profile("fuzz", deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(PROFILE)


def examples(n: int, **options: Any) -> settings:
    """The settings of a property test that tries ``n`` examples (times the fuzz factor)."""
    return settings(max_examples=n * FACTOR, deadline=None, **options)
