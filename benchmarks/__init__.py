"""Benchmark suite: guard overhead, runtime overhead, route scans, batch writes, memory.

Run ``make bench`` (everything, about 15-20 minutes on a 2-core machine) or
``python -m benchmarks --quick`` (small sizes, under a minute). It is never
part of the unit tests: pytest only collects ``tests/``.

Every figure is the median of at least five runs alternated with its baseline
(A B A B ...), reported as a ratio against that baseline; absolute times are
printed too. See docs/performance.md for what each ratio means.
"""
