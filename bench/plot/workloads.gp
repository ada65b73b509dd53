# bench/plot/workloads.gp: interactive p99 wait (until the work began) and refusals while a batch load saturates the gate, one shared
# gate against workload classes (docs/workloads.md).
#   gnuplot -e "data='bench/results/workloads-STAMP.csv'; out='docs/figures/workloads.png'" bench/plot/workloads.gp
# (scripts/bench-workloads runs it.)
set datafile separator ","
set datafile columnheaders
set terminal pngcairo size 900,400 font "sans,10" noenhanced
set output out
set grid lc rgb "#dddddd"
set key top left box opaque
set style line 1 lc rgb "#d62728" lw 2 pt 5 ps 0.9   # shared
set style line 2 lc rgb "#1f77b4" lw 2 pt 7 ps 0.9   # classes
# The program writes the two arms alternately (shared, classes) for each batch concurrency: every 2::0 and
# every 2::1 pick one arm's rows, so that each arm's points are joined.
set multiplot layout 1,2 title "interactive calls (SELECT 1, queue wait 100 ms) under a saturating batch load"
set logscale x 2
set xrange [6:42]
set xtics (8, 16, 32)
set xlabel "batch callers (closed loop, pg_sleep per transaction)"
set logscale y 10
set yrange [0.1:1000]
set ylabel "interactive p99 wait for the work to begin (ms, log)"
plot data using "batch_callers":"wait_p99_ms" every 2::0 with linespoints ls 1 title "one shared gate", \
     data using "batch_callers":"wait_p99_ms" every 2::1 with linespoints ls 2 title "classes: interactive reserves 2"
unset logscale y
set yrange [-5:105]
set key center left
set ylabel "interactive calls refused (%)"
plot data using "batch_callers":"refused_pct" every 2::0 with linespoints ls 1 title "one shared gate", \
     data using "batch_callers":"refused_pct" every 2::1 with linespoints ls 2 title "classes: interactive reserves 2"
unset multiplot
