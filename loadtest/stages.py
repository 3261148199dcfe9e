#!/usr/bin/env python3
"""stages.py splits a Go program's perf profile into the stages of a request.

    perf script -i server.perf.data | python3 loadtest/stages.py [US]

reads the samples of `perf record -g` (frame pointers: Go keeps them), and
gives each sample to ONE stage: of the stages its call chain passes
through (kernel frames count for the Go function that called into the
kernel), the first in STAGES' order. The order is a priority, not the
call order: an allocation that triggers the garbage collector's help is
the collector's; a Redis round trip made by the lock library is the
lock's; a JSON encoder called by a handler is encoding, not the handler.
It prints each stage's share of the samples, and, given US (the
program's CPU µs per request or order, measured without perf), each
stage's µs.

Used by loadtest/success.sh (PROFILE=1). Meant for reading, not for
precision: a stage's figure moves by a few tenths from run to run.
"""
import re
import sys

# (stage, pattern matched against a frame's symbol). The first stage
# whose pattern matches any frame of a sample wins.
STAGES = [
    ("GC", r"^runtime\.(gcBgMarkWorker|gcAssistAlloc|gcDrain|bgsweep|bgscavenge|markroot|gcMarkDone|gcStart|sweepone|scanobject|greyobject|wbBufFlush)"),
    ("scheduler, timers, netpoll", r"^runtime\.(schedule|findRunnable|park_m|goschedImpl|mcall|goexit0|netpoll|stopm|startm|notesleep|notewakeup|sysmon|mstart|checkTimers|runtimer|wakep|handoffp|ready|goready|exitsyscall|entersyscall|futexsleep|futexwakeup|morestack|newstack|retake|usleep|osyield|lock2|unlock2|runqgrab|stealWork)"),
    # Verify, not the whole package: Authenticate's closure calls c.Next,
    # so it sits under every later handler's samples (inlined into routes
    # in today's binary, but a build that keeps it would give JWT all).
    ("JWT (token check)", r"^(seckill/internal/auth\.\(\*Tokens\)\.Verify|github\.com/golang-jwt/)"),
    ("the lock (Obtain/Release, watchdog)", r"^seckill/internal/lock\."),
    ("ID drawing", r"^seckill/internal/idworker\."),
    ("MySQL (gorm, driver, group commit, consumer's writes)", r"^(gorm\.io/|github\.com/go-sql-driver/|database/sql\.|seckill/internal/order\.(\(\*groupCommit\)|writeNew|writeBatch|take$|QueueWriter|\(\*QueueWriter\)|persist))"),
    ("stream consumer's Redis (read, ack, parse)", r"^seckill/internal/order/queue\.\(\*Consumer\)"),
    ("Redis (go-redis, autopipe, scripts)", r"^(github\.com/redis/go-redis/|seckill/internal/autopipe\.|seckill/internal/stock\.|seckill/internal/order/queue\.)"),
    ("encoding (JSON, answers)", r"^(encoding/json\.|seckill/internal/web\.(Error|abort|appendString|JSON|Answer)|github\.com/gin-gonic/gin\.\(\*Context\)\.(Render|Data|JSON)|github\.com/gin-gonic/gin/render\.)"),
    ("HTTP write (headers, write syscall)", r"^(net/http\.\(\*response\)\.|net/http\.\(\*chunkWriter\)|net/http\.checkConnErrorWriter|net/http\.Header\.|net/http\.\(\*conn\)\.finalFlush|net/http\.\(\*response\)\.finishRequest)"),
    ("HTTP read (request parsing, read syscall)", r"^(net/http\.\(\*conn\)\.readRequest|net/http\.readRequest|net/http\.\(\*connReader\)|net/http\.\(\*body\)|net/textproto\.)"),
    ("order logic (order, voucher, memory)", r"^seckill/internal/(order|voucher)\."),
    ("admission, middleware, gin, metrics", r"^(github\.com/gin-gonic/|seckill/internal/(admission|metrics|tracing|apperr|web|auth)\.|main\.|net/http\.serverHandler)"),
    ("HTTP other (conn loop, accept)", r"^net/http\."),
]
COMPILED = [(name, re.compile(p)) for name, p in STAGES]
OTHER = "other (runtime, kernel alone)"


def samples(lines):
    """Yields each sample's list of symbols, leaf first."""
    frames = []
    for line in lines:
        if not line.strip():
            if frames:
                yield frames
            frames = []
            continue
        if line[0] in " \t":
            parts = line.split(None, 1)
            if len(parts) == 2:
                sym = parts[1].rsplit(" (", 1)[0]
                sym = re.sub(r"\+0x[0-9a-f]+$", "", sym)
                frames.append(sym)
        else:
            if frames:
                yield frames
            frames = []
    if frames:
        yield frames


def stage_of(frames):
    for name, rx in COMPILED:
        for f in frames:
            if rx.search(f):
                return name
    return OTHER


def main():
    us = float(sys.argv[1]) if len(sys.argv) > 1 else None
    counts = {}
    total = 0
    for frames in samples(sys.stdin):
        s = stage_of(frames)
        counts[s] = counts.get(s, 0) + 1
        total += 1
    if total == 0:
        print("no samples")
        return
    order = [n for n, _ in STAGES] + [OTHER]
    print(f"{'stage':<56} {'share':>6}" + (f" {'µs':>6}" if us is not None else "") + f"   ({total} samples)")
    for name in order:
        n = counts.get(name, 0)
        if not n:
            continue
        line = f"{name:<56} {100 * n / total:5.1f}%"
        if us is not None:
            line += f" {us * n / total:6.1f}"
        print(line)


if __name__ == "__main__":
    main()
