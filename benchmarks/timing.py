"""The one timing rule every benchmark uses: warm up once, then keep the best of N runs."""

from __future__ import annotations

import time


def best_time(function, repeat: int) -> float:
    """Seconds of the fastest of ``repeat`` calls of ``function``, after one warm-up call.

    The minimum, not the mean: on a shared machine every disturbance only adds time, so the
    fastest run is the best estimate of the code's own cost.
    """
    function()  # warm up: first-call allocations, caches, lazy imports
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)
