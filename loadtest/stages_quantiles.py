#!/usr/bin/env python3
"""stages_quantiles.py BEFORE AFTER: the quantiles of each stage of the
selling requests sent between two scrapes of the server's /metrics.

BEFORE and AFTER hold the lines of seckill_stage_duration_seconds_bucket
(the stock script, the lock, the commit, the confirm: package order's
stages) as the server exposed them before and after a run. The run's own histogram is
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
                return -lower  # past the last finite bound: at least that (negative: printed ">")
            inside = count - below
            return lower + (upper - lower) * ((rank - below) / inside if inside else 0)
        lower, below = upper, count
    return lower


def main():
    before, after = read(sys.argv[1]), read(sys.argv[2])
    if not after:
        print("not read: the server's /metrics did not answer after the run")
        return
    out = []
    for stage in ("stock", "lock", "commit", "confirm"):
        if stage not in after:
            continue
        was = before.get(stage, {})
        if math.inf not in after[stage] or (was and math.inf not in was):
            out.append("%s: incomplete scrape" % stage)
            continue
        buckets = sorted((le, n - was.get(le, 0)) for le, n in after[stage].items())
        if any(n < 0 for _, n in buckets):
            out.append("%s: counters reset (the server restarted?)" % stage)
            continue
        n = buckets[-1][1]
        if n <= 0:
            continue
        out.append("%s (%d): %s" % (stage, n, " ".join(
            "%s %s" % (name, fmt(quantile(q, buckets))) for name, q in (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999)))))
    print("; ".join(out) if out else "no stage observed")


def fmt(seconds):
    """ms; a quantile past the last finite bucket is only "more than"."""
    return ">%.0f" % (-seconds * 1000) if seconds < 0 else "%.1f" % (seconds * 1000)


if __name__ == "__main__":
    main()
