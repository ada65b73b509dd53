# bench/plot/pg_spike.gp: a 10 s spike to 4x capacity (pg_sleep 2 ms), per 0.5 s of intended start times.
#   gnuplot -e "data='bench/results/pg-STAMP-spike.csv'; out='docs/figures/pg_spike.png'" bench/plot/pg_spike.gp
# (scripts/bench runs it.)
load "bench/plot/pg_common.gp"
set terminal pngcairo size 760,680 font "sans,10" noenhanced
set output out
spike(arm, col) = strcol("arm") eq arm ? column(col) : NaN
set multiplot layout 2,1 title "Spike: 0.5x capacity for 3 s, 4x for 10 s, 0.5x for 5 s"
set xrange [0:*]
set xlabel "time (s)"
set ylabel "calls/s"
set yrange [0:*]
set key at graph 0.5, graph 0.85 center top vertical maxrows 3
plot data using "t_s":(spike("gate", "offered_rate")) with lines ls 9 title "offered", \
     data using "t_s":(spike("gate", "goodput")) with linespoints ls 1 title "goodput, (c) gate + pool", \
     data using "t_s":(spike("pool-many", "goodput")) with linespoints ls 2 title "goodput, (d) pool alone, 256 callers"
set logscale y 10
set yrange [1:100000]
set ylabel "admitted p99 (ms, log scale)"
set key at graph 0.98, graph 0.92 right top vertical maxrows 3
plot 100 ls 9 title "deadline (100 ms)", \
     data using "t_s":(spike("gate", "admitted_p99_ms")) with linespoints ls 1 title "(c) gate + pool", \
     data using "t_s":(spike("pool-many", "admitted_p99_ms")) with linespoints ls 2 title "(d) pool alone, 256 callers"
unset multiplot
