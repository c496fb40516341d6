#!/usr/bin/env python3
"""Groups a flat `perf report` of the server threads into the classes used in BENCHMARKS.md.

Usage (after `perf record -e cpu-clock -F 997 -g -o ws.perf -- ./target/release/xtask bench-ws --rounds 1 --seconds 5`):

    perf report -i ws.perf --time START,END --comm bench-server --sort symbol --stdio \
        --no-children -g none | python3 benches-support/perf_buckets.py

bench-ws runs its phases in this order, each about `--seconds` + 0.3 s of warm-up: bare echo
at 1 and 64 in flight and at half load, the Connector's `echo_noop` the same three ways, the
durable Tool at 1 and 64 in flight, raw SQLite commits. START,END are absolute perf
timestamps (the first sample's time from `perf script -F time | head -1`, plus the phase's
offset); `perf script -F comm,time` shows where the phases change. Each line's self-time
share is put into one class by the symbol's name; the shares are then rescaled to the lines
that were read.
"""

import re
import sys

NET = r"(tcp|skb|inet|dev_|loopback|net_|sock|ip_|__netif|napi|_copy_to_iter|_copy_from_iter|datagram|sk_)"
FILE = r"(ext4|filemap|buffer|posix_lock|fcntl|generic_perform_write|mpage|jbd2|block|folio|page_cache|iomap|vfs_|file|lock_)"
SCHED = r"(sched|switch|futex|spin_unlock|wake|schedule|enqueue|dequeue|pick_|update_curr|rcu|hrtimer|epoll|ep_)"
SQLITE = r"(sqlite3|wal|yy_|tokenExpr|pcache|btree|vdbe|unix|getToken|sqlite|memjrnl|robust_|pager|lookaside|where|select|expr|resolve|codegen|parse)"


def classify(kind: str, symbol: str) -> str:
    if kind == "k":
        # Wake-ups and context switches first: `_raw_spin_unlock_irqrestore` (where a wake-up
        # re-enables interrupts) would otherwise count as a file lock by its `lock_`.
        if re.search(SCHED, symbol):
            return "kernel: scheduling, wake-ups, futex, epoll"
        if re.search(NET, symbol):
            return "kernel: loopback TCP"
        if re.search(FILE, symbol):
            return "kernel: file writes + fcntl locks (SQLite)"
        return "kernel: other"
    if re.match(SQLITE, symbol, re.I) or "rusqlite" in symbol:
        return "SQLite (incl. SQL parsing)"
    if any(name in symbol for name in ("tokio", "futures", "mio")):
        return "tokio/futures"
    if "xagent" in symbol:
        return "xagent code"
    # glibc's names carry prefixes and CPU suffixes (`__memmove_avx512_unaligned_erms`).
    if re.match(r"_*(malloc|_int_|free|cfree|realloc|calloc|unlink_chunk|__libc|mem(cpy|move|set|cmp)|__rustc::__r)", symbol):
        return "malloc/memcpy"
    if any(name in symbol for name in ("Mutex", "futex", "pthread")):
        return "std Mutex"
    if "serde" in symbol:
        return "serde"
    if any(name in symbol for name in ("tungstenite", "axum", "hyper")):
        return "ws/http"
    return "other"


def main() -> None:
    buckets: dict[str, float] = {}
    total = 0.0
    for line in sys.stdin:
        match = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(.*?)\s*$", line)
        if not match:
            continue
        share, kind, symbol = float(match.group(1)), match.group(2), match.group(3).split("  ")[0]
        total += share
        key = classify(kind, symbol)
        buckets[key] = buckets.get(key, 0.0) + share
    if total == 0:
        sys.exit("no perf report lines on stdin")
    for key, share in sorted(buckets.items(), key=lambda item: -item[1]):
        print(f"{key}: {100 * share / total:.1f} %")


if __name__ == "__main__":
    main()
