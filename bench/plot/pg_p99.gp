# bench/plot/pg_p99.gp: p99 latency of admitted work versus offered load, pg_sleep(2 ms), one line per arm.
#   gnuplot -e "data='bench/results/pg-STAMP-open.csv'; out='docs/figures/pg_p99.png'" bench/plot/pg_p99.gp
# (scripts/bench runs it.)
load "bench/plot/pg_common.gp"
set key bottom right
set output out
set title "p99 latency of admitted calls, from the intended start (pg_sleep 2 ms)"
set logscale x 2
set xrange [0.42:9.5]
set xtics ("0.5" 0.5, "0.8" 0.8, "1" 1, "2" 2, "4" 4, "8" 8)
set xlabel "offered load (multiples of the measured capacity)"
set logscale y 10
set yrange [0.3:10000]
set ylabel "admitted p99 (ms, log scale)"
plot 100 ls 9 title "deadline (100 ms)", \
     data using "load":(sleep_row("gate", "admitted_p99_ms")) with linespoints ls 1 title "(c) gate + pool", \
     data using "load":(sleep_row("pool-many", "admitted_p99_ms")) with linespoints ls 2 title "(d) pool alone, 256 callers", \
     data using "load":(sleep_row("raw", "admitted_p99_ms")) with linespoints ls 3 title "(a) raw libpqxx, 4 connections", \
     data using "load":(sleep_row("pool", "admitted_p99_ms")) with linespoints ls 4 title "(b) pool alone, 4 callers"
