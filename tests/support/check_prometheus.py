#!/usr/bin/python3
"""Checks a Prometheus text exposition (format 0.0.4) with a real parser.

Usage: check_prometheus.py FILE

Parses FILE with prometheus_client's text parser (Debian package
python3-prometheus-client), then checks what the parser tolerates but a
scraper's users rely on: every family has HELP and TYPE once, names follow the
conventions (snake_case, counters end in _total, durations in _seconds),
histogram buckets are cumulative and end in +Inf equal to _count, and no
sample value is negative. Exits 0 and prints a summary when the text is valid,
1 with the reasons otherwise.
"""
import math
import re
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("check_prometheus: python3-prometheus-client is missing (apt-get install python3-prometheus-client)")
    sys.exit(2)

NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def main(path):
    text = open(path, encoding="utf-8").read()
    problems = []
    if not text.endswith("\n"):
        problems.append("the exposition must end with a newline")
    helps, types = {}, {}
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split(" ", 3)[2]
            helps[name] = helps.get(name, 0) + 1
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = types.get(name, 0) + 1
            if kind not in ("counter", "gauge", "histogram", "summary", "untyped"):
                problems.append(f"{name}: unknown type {kind}")
            if kind == "counter" and not name.endswith("_total"):
                problems.append(f"{name}: a counter's name must end in _total")
            if kind == "histogram" and not name.endswith("_seconds"):
                problems.append(f"{name}: a duration histogram must be in _seconds")
        elif line and not line.startswith("#"):
            if " " not in line:
                problems.append(f"malformed sample line: {line!r}")
    for name in set(helps) | set(types):
        if helps.get(name) != 1 or types.get(name) != 1:
            problems.append(f"{name}: HELP x{helps.get(name, 0)}, TYPE x{types.get(name, 0)} (want exactly one each)")
        if not NAME.match(name) or name != name.lower():
            problems.append(f"{name}: not a snake_case metric name")

    families = list(text_string_to_metric_families(text))  # raises on malformed text
    samples = 0
    for family in families:
        buckets = {}
        counts = {}
        for sample in family.samples:
            samples += 1
            if sample.value < 0 or math.isnan(sample.value):
                problems.append(f"{sample.name}{sample.labels}: negative or NaN value {sample.value}")
            if family.type == "histogram":
                key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
                if sample.name.endswith("_bucket"):
                    buckets.setdefault(key, []).append((float(sample.labels["le"]), sample.value))
                elif sample.name.endswith("_count"):
                    counts[key] = sample.value
        for key, series in buckets.items():
            bounds = [bound for bound, _ in series]
            if bounds != sorted(bounds) or bounds[-1] != math.inf:
                problems.append(f"{family.name}{dict(key)}: le bounds not increasing to +Inf")
            values = [value for _, value in series]
            if any(b < a for a, b in zip(values, values[1:])):
                problems.append(f"{family.name}{dict(key)}: buckets are not cumulative")
            if values[-1] != counts.get(key):
                problems.append(f"{family.name}{dict(key)}: +Inf bucket {values[-1]} != _count {counts.get(key)}")
    if problems:
        print("check_prometheus: INVALID")
        for problem in problems:
            print("  " + problem)
        return 1
    print(f"check_prometheus: valid, {len(families)} families, {samples} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
