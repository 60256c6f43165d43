#!/usr/bin/env python3
"""One line per profiled kernel launch from `ncu --csv` output: launch ID, kernel name (template arguments kept,
anonymous namespaces and parameter lists dropped, cut to 90 characters), grid, gpu__time_duration in us.

usage: ncu --csv --clock-control none --metrics gpu__time_duration.sum -k regex:NAME --launch-count N PROGRAM ARGS \\
           2>/dev/null | python3 bench/ncu-kernel-times.py

Lines that are not CSV rows (the program's own output, ncu's ==PROF== lines) are skipped.  bench/RESULTS.md's
per-kernel tables since 2026-11-28 (sixteenth session) were read this way."""
import csv
import re
import sys

UNIT_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def main():
    rows = list(csv.reader(line for line in sys.stdin if line.startswith('"')))
    if not rows:
        return 0
    header = rows[0]
    try:
        i_id, i_name = header.index("ID"), header.index("Kernel Name")
        i_grid, i_value = header.index("Grid Size"), header.index("Metric Value")
        i_unit = header.index("Metric Unit")
    except ValueError as missing:
        sys.exit(f"ncu-kernel-times: not ncu --csv output ({missing})")
    for row in rows[1:]:
        name = row[i_name].replace('(anonymous namespace)::', '').replace('<unnamed>::', '')
        name = re.sub(r'^void ', '', name)
        match = re.match(r'([A-Za-z0-9_:]+)(<[^(]*>)?', name)
        short = (match.group(1) + (match.group(2) or '')) if match else name
        short = short.replace('__nv_bfloat16', 'bf16')[:90]
        scale = UNIT_TO_US.get(row[i_unit])
        if scale is None:
            sys.exit(f"ncu-kernel-times: unknown unit {row[i_unit]!r} (ask for --metrics gpu__time_duration.sum)")
        us = float(row[i_value].replace(',', '')) * scale
        print(f"{row[i_id]:>4} {short:90s} {row[i_grid]:>14s} {us:10.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
