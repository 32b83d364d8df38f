#!/usr/bin/env python3
"""Prints the median cost, in microseconds, of one call that a FUSE mount must send to its
daemon every time: `statvfs` (never cached by the kernel) and `stat` of a name that does not
exist (a new name each call, so no cached absence answers it). Usage: round-trip.py DIR"""
import os
import statistics
import sys
import time

directory = sys.argv[1]
CALLS = 5000


def per_call(call):
    """Median over 5 batches of CALLS calls, in microseconds per call."""
    batches = []
    for batch in range(5):
        start = time.perf_counter()
        for i in range(CALLS):
            call(batch, i)
        batches.append((time.perf_counter() - start) / CALLS * 1e6)
    return statistics.median(batches)


def missing(batch, i):
    try:
        os.stat(f"{directory}/missing-{os.getpid()}-{batch}-{i}")
    except FileNotFoundError:
        pass


print(f"{per_call(lambda b, i: os.statvfs(directory)):.2f} {per_call(missing):.2f}")
