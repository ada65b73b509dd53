#!/usr/bin/env python3
"""Open-loop load on examples/http_service, with latency by status: the
figures of docs/performance.md, "The HTTP example at 1x and 4x capacity".

wrk reports one latency distribution for all answers; this client keeps the
200s and the 503s apart. Requests are sent at a fixed rate, each at its
scheduled time whatever the earlier ones did, over a pool of keep-alive
connections (one thread each); latency is measured from the scheduled send
time, so a backlog on the client side counts against the server too.

    bench/async/http_load.py --port PORT --rate 400 --seconds 5 [--connections 64]

Prints one Markdown table row: offered rate, 200/s (goodput), 503/s, other
statuses, p50/p99 of the 200s and of the 503s in ms.
"""
import argparse
import http.client
import queue
import threading
import time


def percentile(values, fraction):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * (len(ordered) - 1) + 0.5))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True, help="requests per second")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()

    schedule = queue.Queue()
    results = []  # (status, latency seconds)
    lock = threading.Lock()

    def worker():
        connection = http.client.HTTPConnection("127.0.0.1", args.port, timeout=30)
        while True:
            due = schedule.get()
            if due is None:
                return
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            try:
                connection.request("GET", "/value")
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                status = 0
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", args.port, timeout=30)
            with lock:
                results.append((status, time.monotonic() - due))

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.connections)]
    for thread in threads:
        thread.start()
    start = time.monotonic() + 0.2
    count = int(args.rate * args.seconds)
    for index in range(count):
        schedule.put(start + index / args.rate)
    for _ in threads:
        schedule.put(None)
    for thread in threads:
        thread.join()

    ok = [latency * 1000 for status, latency in results if status == 200]
    busy = [latency * 1000 for status, latency in results if status == 503]
    other = len(results) - len(ok) - len(busy)
    print(f"| {args.rate:.0f}/s | {len(ok) / args.seconds:.1f} | {len(busy) / args.seconds:.1f} | {other} | "
          f"{percentile(ok, 0.5):.1f} / {percentile(ok, 0.99):.1f} | "
          f"{percentile(busy, 0.5):.1f} / {percentile(busy, 0.99):.1f} |")


if __name__ == "__main__":
    main()
