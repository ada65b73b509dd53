# bench/plot/pg_goodput.gp: goodput versus offered load, pg_sleep(2 ms), one line per arm.
#   gnuplot -e "data='bench/results/pg-STAMP-open.csv'; out='docs/figures/pg_goodput.png'" bench/plot/pg_goodput.gp
# (scripts/bench runs it.)
load "bench/plot/pg_common.gp"
set key right center
set output out
stats data using (sleep_row("gate", "capacity")) name "cap" nooutput
set title sprintf("Goodput under open-loop load (pg_sleep 2 ms, capacity %.0f calls/s)", cap_mean)
set logscale x 2
set xrange [0.42:9.5]
set xtics ("0.5" 0.5, "0.8" 0.8, "1" 1, "2" 2, "4" 4, "8" 8)
set xlabel "offered load (multiples of the measured capacity)"
set ylabel "goodput (calls/s completed within 100 ms)"
set yrange [0:*]
plot (x < 1 ? x : 1) * cap_mean ls 9 title "ideal: min(load, 1) x capacity", \
     data using "load":(sleep_row("gate", "goodput")) with linespoints ls 1 title "(c) gate + pool", \
     data using "load":(sleep_row("pool-many", "goodput")) with linespoints ls 2 title "(d) pool alone, 256 callers", \
     data using "load":(sleep_row("raw", "goodput")) with linespoints ls 3 title "(a) raw libpqxx, 4 connections", \
     data using "load":(sleep_row("pool", "goodput")) with linespoints ls 4 title "(b) pool alone, 4 callers"
