#!/usr/bin/env python3
"""Turns one run of bulkhead_micro_bench (its --benchmark_out JSON, with
--benchmark_repetitions and aggregates) into the ratio tables of
docs/performance.md, in Markdown, and checks the issue's targets.

Every ratio is between two benchmarks of the same run. A one-thread time is
the fastest of the repetitions (on a shared machine noise only adds time); a
threaded time and every counter is the median.

    python3 bench/micro_report.py bench/results/micro-<date>.json

Exits 0 whatever the targets say (a missed target is reported, not fatal);
exits 2 when the file lacks a benchmark the tables need.
"""
import json
import sys

THREADS = (2, 4, 16, 64)


def load(path):
    """The median and the min aggregate of every benchmark, by run name (a
    run without repetitions stands for both)."""
    with open(path, encoding="utf-8") as handle:
        data = json.load(handle)
    medians, minima = {}, {}
    for run in data["benchmarks"]:
        if run.get("error_occurred"):
            print(f"warning: {run['name']} failed: {run.get('error_message')}", file=sys.stderr)
            continue
        kind = run.get("aggregate_name") if run.get("run_type") == "aggregate" else None
        if kind in (None, "median"):
            medians[run["run_name"]] = run
        if kind in (None, "min"):
            minima[run["run_name"]] = run
    return data["context"], medians, minima


class Report:
    def __init__(self, medians, minima):
        self.medians = medians
        self.minima = minima
        self.missing = []
        self.verdicts = []

    def run(self, name):
        run = self.medians.get(name)
        if run is None:
            self.missing.append(name)
        return run

    def ns(self, name):
        """Real time per iteration in ns: for a one-thread run the fastest
        repetition (noise only adds time), for a threaded run the median."""
        run = self.run(name)
        if run is None:
            return None
        if "threads:" not in name or name.endswith("threads:1"):
            run = self.minima.get(name, run)
        scale = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[run["time_unit"]]
        return run["real_time"] * scale

    def counter(self, name, counter):
        run = self.run(name)
        return None if run is None else run.get(counter)

    def wall_ns(self, name):
        """Wall time per operation of a threaded run (the wall_ns/op counter:
        first thread's first iteration to last thread's last), or the real
        time of a one-thread run."""
        wall = self.counter(name, "wall_ns/op")
        return wall if wall is not None else self.ns(name)

    def verdict(self, target, figure, met):
        self.verdicts.append((target, figure, "met" if met else ("unknown" if met is None else "MISSED")))


def fmt(value, digits=3):
    if value is None:
        return "n/a"
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def uncontended(report):
    std16 = "std_counting_semaphore/acquire_release/permits:16/real_time"
    std1 = "std_counting_semaphore/acquire_release/permits:1/real_time"
    pair = "atomic_pair/fetch_sub_fetch_add/real_time/threads:1"
    rows = []

    def row(label, name, base_label=None, base=None, target=None):
        mine = report.ns(name)
        versus = report.ns(base) if base else None
        rows.append([label, fmt(mine), base_label or "", fmt(ratio(mine, versus)) if base else "", target or ""])
        return mine, versus

    row("fifo_semaphore acquire+release (16 permits)", "fifo_semaphore/acquire_release/permits:16/real_time",
                    "std::counting_semaphore (16)", std16, "<= 1.2x")
    row("fifo_semaphore acquire+release (1 permit)", "fifo_semaphore/acquire_release/permits:1/real_time",
        "std::counting_semaphore (1)", std1)
    row("fifo_semaphore try_acquire_for+release", "fifo_semaphore/try_acquire_for_release/permits:16/real_time",
        "std::counting_semaphore (16)", std16)
    row("fifo_semaphore try_acquire_for(stop_token)+release",
        "fifo_semaphore/try_acquire_for_stop_token_release/permits:16/real_time", "std::counting_semaphore (16)", std16)
    row("mutex+condition_variable semaphore", "cv_semaphore/acquire_release/permits:16/real_time",
        "std::counting_semaphore (16)", std16)
    row("std::counting_semaphore (16 permits)", std16)
    row("std::counting_semaphore (1 permit)", std1)
    row("admission_counter try_acquire+release", "admission_counter/try_acquire_release/real_time/threads:1",
                         "atomic fetch_sub+fetch_add", pair, "<= 1.2x")
    row("atomic fetch_sub+fetch_add (the floor)", pair)
    row("gate enter() + permit.release()", "gate/enter_leave/permits:1/real_time", target="< 25 ns")
    row("gate transaction(0ms, noop)", "gate/transaction/permits:1/real_time")
    row("gate try_transaction(0ms, noop)", "gate/try_transaction/permits:1/real_time")
    return table(["one acquire + release, 1 thread", "ns", "compared with", "ratio", "target"], rows)


def rejects(report):
    names = [
        ("admission_counter::try_acquire, 0 slots", "reject/admission_counter_try_acquire/real_time"),
        ("fifo_semaphore::try_acquire, 0 permits", "reject/fifo_semaphore_try_acquire/real_time"),
        ("std::counting_semaphore::try_acquire, 0", "reject/std_counting_semaphore_try_acquire/real_time"),
        ("mutex+cv semaphore try_acquire, 0", "reject/cv_semaphore_try_acquire/real_time"),
        ("gate try_enter(), full", "reject/gate_try_enter/real_time/threads:1"),
        ("gate try_transaction(0ms, noop), full", "reject/gate_try_transaction/real_time"),
        ("gate enter(), full: throws admission_full", "reject/gate_enter_throws/real_time"),
        ("gate transaction(0ms, noop), full: throws", "reject/gate_transaction_throws/real_time"),
    ]
    rows = []
    for label, name in names:
        rows.append([label, fmt(report.ns(name)), fmt(report.counter(name, "allocs/op")),
                     fmt(report.counter(name, "syscalls/op")), fmt(report.counter(name, "vcsw/op"))])
    text = table(["reject path (1 thread)", "ns", "allocs/op", "syscalls/op", "vcsw/op"], rows)

    std = report.ns("reject/std_counting_semaphore_try_acquire/real_time")
    ratio_rows = []
    for label, name in (("try_enter", "reject/gate_try_enter/real_time/threads:1"),
                        ("try_transaction", "reject/gate_try_transaction/real_time")):
        mine = report.ns(name)
        ratio_rows.append([f"std::counting_semaphore::try_acquire (empty) / gate {label} (full)",
                           fmt(ratio(std, mine)), ">= 100x and < 20 ns"])
        allocs = report.counter(name, "allocs/op")
        syscalls = report.counter(name, "syscalls/op")
        vcsw = report.counter(name, "vcsw/op")
        met = None if allocs is None else (allocs == 0 and (syscalls is None or syscalls == 0) and vcsw == 0)
        report.verdict(f"reject path ({label}): no syscall, no allocation",
                       f"allocs/op {fmt(allocs)}, syscalls/op {fmt(syscalls)}, vcsw/op {fmt(vcsw)}", met)
    name = "reject/admission_counter_try_acquire/real_time"
    allocs, syscalls = report.counter(name, "allocs/op"), report.counter(name, "syscalls/op")
    report.verdict("reject path (admission_counter): no syscall, no allocation",
                   f"allocs/op {fmt(allocs)}, syscalls/op {fmt(syscalls)}",
                   None if allocs is None else (allocs == 0 and (syscalls is None or syscalls == 0)))
    for label, throwing, plain in (
            ("enter() / try_enter()", "reject/gate_enter_throws/real_time", "reject/gate_try_enter/real_time/threads:1"),
            ("transaction() / try_transaction()", "reject/gate_transaction_throws/real_time",
             "reject/gate_try_transaction/real_time")):
        ratio_rows.append([f"throwing / non-throwing reject: {label}",
                           fmt(ratio(report.ns(throwing), report.ns(plain))), ""])
    scaling = []
    for threads in (1,) + THREADS:
        scaling.append(f"{threads}: {fmt(report.wall_ns(f'reject/gate_try_enter/real_time/threads:{threads}'))}")
    ratio_rows.append(["gate try_enter (full) from N threads at once, wall ns per reject (all threads)",
                       "; ".join(scaling), ""])
    return text + "\n\n" + table(["ratio", "value", "target"], ratio_rows)


PAIRED = "/iterations:200/real_time"


def paired(report):
    """The targets that are ratios, from the paired benchmarks: the two
    operations timed in alternating blocks of one benchmark, each side its
    fastest block (median over the repetitions)."""
    rows = []

    def pair(name):
        run = "paired/" + name + PAIRED
        return report.counter(run, "a_ns"), report.counter(run, "b_ns")

    fifo, std = pair("fifo_semaphore_vs_std_counting_semaphore")
    rows.append(["fifo_semaphore / std::counting_semaphore, acquire+release, 16 permits", fmt(fifo), fmt(std),
                 fmt(ratio(fifo, std)) + "x", "<= 1.2x"])
    report.verdict("uncontended fifo_semaphore acquire+release <= 1.2x std::counting_semaphore",
                   f"{fmt(ratio(fifo, std))}x ({fmt(fifo)} / {fmt(std)} ns)",
                   None if ratio(fifo, std) is None else ratio(fifo, std) <= 1.2)
    counter, floor = pair("admission_counter_vs_atomic_pair")
    rows.append(["admission_counter try_acquire+release / atomic fetch_sub+fetch_add", fmt(counter), fmt(floor),
                 fmt(ratio(counter, floor)) + "x", "<= 1.2x"])
    report.verdict("admission_counter admit+release <= 1.2x raw atomic pair",
                   f"{fmt(ratio(counter, floor))}x ({fmt(counter)} / {fmt(floor)} ns)",
                   None if ratio(counter, floor) is None else ratio(counter, floor) <= 1.2)
    gate, floor2 = pair("gate_enter_leave_vs_atomic_pair")
    rows.append(["gate enter()+release() over a do-nothing pool / atomic pair", fmt(gate), fmt(floor2),
                 fmt(ratio(gate, floor2)) + "x", "gate < 25 ns"])
    report.verdict("full gate enter/leave over a do-nothing pool < 25 ns", f"{fmt(gate)} ns",
                   None if gate is None else gate < 25)
    for label, name in (("try_enter", "gate_try_enter_reject_vs_std_try_acquire_empty"),
                        ("try_transaction", "gate_try_transaction_reject_vs_std_try_acquire_empty")):
        mine, std_empty = pair(name)
        faster = ratio(std_empty, mine)
        rows.append([f"gate {label} on a full gate / std::counting_semaphore::try_acquire on 0", fmt(mine),
                     fmt(std_empty), f"{fmt(faster)}x faster", ">= 100x faster and < 20 ns"])
        report.verdict(f"non-throwing reject ({label}) >= 100x faster than std try_acquire on empty, < 20 ns",
                       f"{fmt(faster)}x faster, {fmt(mine)} ns",
                       None if faster is None else (faster >= 100 and mine < 20))
    gate_reject, counter_reject = pair("gate_try_enter_reject_vs_admission_counter_reject")
    added = None if gate_reject is None or counter_reject is None else gate_reject - counter_reject
    rows.append(["gate try_enter on a full gate / admission_counter::try_acquire with 0 slots (the floor)",
                 fmt(gate_reject), fmt(counter_reject), f"+{fmt(added)} ns", "counts < 5 ns"])
    report.verdict("gate counters (and the default observer) cost < 5 ns per call on the admission path",
                   f"at most {fmt(added)} ns: all the gate adds to the bare counter's rejection",
                   None if added is None else added < 5)
    observed, plain = pair("gate_try_enter_reject_counting_observer_vs_null_observer")
    rows.append(["gate try_enter rejection, a counting observer / null_observer (the default)", fmt(observed),
                 fmt(plain), fmt(ratio(observed, plain)) + "x", ""])
    return table(["paired (alternating blocks in one benchmark)", "A ns", "B ns", "A vs B", "target"], rows)


def contended(report):
    families = [
        ("fifo_semaphore acquire", "fifo_semaphore/acquire_release", True),
        ("fifo_semaphore try_acquire_for", "fifo_semaphore/try_acquire_for_release", True),
        ("fifo_semaphore try_acquire_for(stop)", "fifo_semaphore/try_acquire_for_stop_token_release", True),
        ("gate enter/leave", "gate/enter_leave", True),
        ("gate transaction", "gate/transaction", True),
        ("gate try_transaction", "gate/try_transaction", True),
        ("std::counting_semaphore", "std_counting_semaphore/acquire_release", False),
        ("mutex+cv semaphore", "cv_semaphore/acquire_release", False),
    ]
    rows = []
    worst_jain = None
    worst_wakes = None
    worst_multi = None
    for label, family, ours in families:
        for threads in THREADS:
            name = f"{family}/permits:1/real_time/threads:{threads}"
            get = lambda counter: report.counter(name, counter)  # noqa: E731
            rows.append([label, threads, fmt(report.wall_ns(name)), fmt(get("wait_p50_ns")), fmt(get("wait_p99_ns")),
                         fmt(get("wait_max_ns")), fmt(get("jain"), 4), fmt(get("vcsw/op")), fmt(get("ivcsw/op")),
                         fmt(get("wakes/op")), fmt(get("multiwakes/op"))])
            if ours:
                jain, wakes, multi = get("jain"), get("wakes/op"), get("multiwakes/op")
                if jain is not None and (worst_jain is None or jain < worst_jain[0]):
                    worst_jain = (jain, f"{label}, {threads} threads")
                if wakes is not None and (worst_wakes is None or wakes > worst_wakes[0]):
                    worst_wakes = (wakes, f"{label}, {threads} threads")
                if multi is not None and (worst_multi is None or multi > worst_multi[0]):
                    worst_multi = (multi, f"{label}, {threads} threads")
    if worst_jain:
        report.verdict("Jain's index >= 0.99 under contention (fifo_semaphore and gate, 2-64 threads)",
                       f"lowest {fmt(worst_jain[0], 4)} ({worst_jain[1]})", worst_jain[0] >= 0.99)
    if worst_multi:
        report.verdict("at most one thread woken per release (no futex wake woke 2+ threads)",
                       f"multiwakes/op at most {fmt(worst_multi[0])} ({worst_multi[1]})", worst_multi[0] == 0)
    if worst_wakes:
        report.verdict("at most one futex wake per release (wake syscalls that woke a thread, per acquire+release)",
                       f"at most {fmt(worst_wakes[0])} ({worst_wakes[1]})", worst_wakes[0] <= 1.0)
    return table(["contended, 1 permit", "threads", "ns/op", "wait p50 ns", "wait p99 ns", "wait max ns", "Jain",
                  "vcsw/op", "ivcsw/op", "wakes/op", "multiwakes/op"], rows)


def scaling(report):
    rows = []
    for label, family in (("atomic fetch_sub+fetch_add", "atomic_pair/fetch_sub_fetch_add"),
                          ("admission_counter try_acquire+release", "admission_counter/try_acquire_release")):
        rows.append([label] + [fmt(report.wall_ns(f"{family}/real_time/threads:{threads}"))
                               for threads in (1,) + THREADS])
    rows.append(["ratio counter / atomic pair"] + [
        fmt(ratio(report.wall_ns(f"admission_counter/try_acquire_release/real_time/threads:{threads}"),
                  report.wall_ns(f"atomic_pair/fetch_sub_fetch_add/real_time/threads:{threads}")))
        for threads in (1,) + THREADS])
    return table(["threads: wall ns per op (all threads)", "1", "2", "4", "16", "64"], rows)


def main(argv):
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    context, medians, minima = load(argv[1])
    report = Report(medians, minima)
    sections = [
        ("Targets that are ratios, measured in pairs", paired(report)),
        ("Uncontended", uncontended(report)),
        ("Reject path", rejects(report)),
        ("Contended (1 permit; ns/op = wall time over all threads; wait = time in acquire; "
         "Jain over a fixed 40 ms window, 10 us sleep under the permit)", contended(report)),
        ("Non-blocking operations on one shared word", scaling(report)),
    ]
    print(f"Source: {context.get('source', 'n/a')}; CPU: {context.get('cpu', 'n/a')}")
    print(f"Run: {context.get('date')}, {context.get('num_cpus')} CPUs at {context.get('mhz_per_cpu')} MHz, "
          f"load at start {context.get('loadavg_at_start', 'n/a')}, {context.get('compiler', '')}, "
          f"libstdc++ {context.get('libstdcxx', '')}, tracepoints: {context.get('tracepoints', 'n/a')}")
    print(f"{medians_repetitions(medians)} repetitions. Times are wall-clock ns per operation: one-thread runs "
          "the fastest repetition, threaded runs and every counter the median.\n")
    for title, text in sections:
        print(f"#### {title}\n\n{text}\n")
    print("#### Targets\n")
    print(table(["target", "figure", "verdict"], report.verdicts))
    if report.missing:
        print(f"\nmissing from the run: {', '.join(sorted(set(report.missing)))}", file=sys.stderr)
        return 2
    return 0


def medians_repetitions(medians):
    counts = {run.get("repetitions") for run in medians.values() if run.get("repetitions")}
    return "/".join(str(count) for count in sorted(counts)) or "1"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
