#!/usr/bin/env python3
"""Writes to stdout a tar stream of N empty files, 1,000 per directory (d1/f1 ... dK/f1000),
without creating them on disk first. Usage: empty-tar.py N"""
import sys
import tarfile

n = int(sys.argv[1])
with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.GNU_FORMAT) as out:
    for d in range(1, (n + 999) // 1000 + 1):
        info = tarfile.TarInfo(f"d{d}")
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        out.addfile(info)
        for f in range(1, min(1000, n - (d - 1) * 1000) + 1):
            info = tarfile.TarInfo(f"d{d}/f{f}")
            info.mode = 0o644
            out.addfile(info)
