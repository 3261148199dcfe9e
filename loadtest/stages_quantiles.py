#!/usr/bin/env python3
"""stages_quantiles.py BEFORE AFTER: the quantiles of each stage of the
selling requests sent between two scrapes of the server's /metrics.

BEFORE and AFTER hold the lines of seckill_stage_duration_seconds_bucket
(the stock script, the lock, the commit: package order's stages) as the
server exposed them before and after a run. The run's own histogram is
their difference; each quantile is read off it as Prometheus'
histogram_quantile reads one: the bucket it falls in, linearly
interpolated between that bucket's bounds. The buckets double from
0.5 ms, so a p99 of 12 ms says "between 8 and 16". Used by tail.sh.
"""
import math
import re
import sys

LINE = re.compile(r'^seckill_stage_duration_seconds_bucket\{(.*)\} (\S+)$')
LABEL = re.compile(r'(\w+)="([^"]*)"')


def read(path):
    hist = {}
    with open(path) as f:
        for line in f:
            m = LINE.match(line.strip())
            if not m:
                continue
            labels = dict(LABEL.findall(m.group(1)))
            le = math.inf if labels["le"] == "+Inf" else float(labels["le"])
            hist.setdefault(labels["stage"], {})[le] = float(m.group(2))
    return hist


def quantile(q, buckets):
    """buckets: [(upper bound, cumulative count)], sorted."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower  # past the last finite bound: at least that
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 0)
        lower, below = upper, count
    return lower


def main():
    before, after = read(sys.argv[1]), read(sys.argv[2])
    out = []
    for stage in ("stock", "lock", "commit"):
        if stage not in after:
            continue
        buckets = sorted((le, n - before.get(stage, {}).get(le, 0)) for le, n in after[stage].items())
        n = buckets[-1][1] if buckets else 0
        if n <= 0:
            continue
        qs = " ".join("%s %.1f" % (name, quantile(q, buckets) * 1000) for name, q in (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999)))
        out.append("%s (%d): %s" % (stage, n, qs))
    print("; ".join(out) if out else "no stage observed")


if __name__ == "__main__":
    main()
