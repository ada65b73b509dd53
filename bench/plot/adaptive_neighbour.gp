# bench/plot/adaptive_neighbour.gp: fixed and adaptive gates through a quiet phase, a pgbench neighbour, and quiet again,
# per 0.5 s of intended start times.
#   gnuplot -e "data='bench/results/neighbour-STAMP-neighbour.csv'; loop='open'; out='bench/results/neighbour-STAMP-neighbour_open.png'" bench/plot/adaptive_neighbour.gp
# (loop='closed' for the closed loop; adaptive_title='adaptive 4..64' names a non-default adaptive arm)
# (scripts/bench-neighbour runs it.)
load "bench/plot/pg_common.gp"
set terminal pngcairo size 760,1150 font "sans,10" noenhanced
set output out
if (!exists("adaptive_title")) adaptive_title = "adaptive 1..64"
set datafile separator ","
mine(prefix) = strcol("loop") eq loop && strcol("arm")[1:strlen(prefix)] eq prefix
best(col) = mine("fixed best") ? column(col) : NaN
high(col) = mine("fixed B =") ? column(col) : NaN
adaptive(col) = mine("adaptive") ? column(col) : NaN
set multiplot layout 4,1 title sprintf("Noisy neighbour, %s loop: quiet, pgbench scanning beside the service, quiet again", loop)
set xrange [0:*]
set xlabel "time (s)"
set key top right horizontal
set ylabel "goodput (calls/s)"
set yrange [0:*]
plot data using "t_s":(best("goodput")) with lines ls 1 title "fixed, best B", \
     data using "t_s":(high("goodput")) with lines ls 2 title "fixed, B = 64", \
     data using "t_s":(adaptive("goodput")) with lines ls 3 title adaptive_title
set logscale y 10
set yrange [0.5:1000]
set ylabel "admitted p99 (ms, log scale)"
plot 250 ls 9 title "deadline (250 ms)", \
     data using "t_s":(best("admitted_p99_ms")) with lines ls 1 title "fixed, best B", \
     data using "t_s":(high("admitted_p99_ms")) with lines ls 2 title "fixed, B = 64", \
     data using "t_s":(adaptive("admitted_p99_ms")) with lines ls 3 title adaptive_title
unset logscale y
set yrange [0:70]
set ylabel "execution permits in circulation"
plot data using "t_s":(best("limit")) with lines ls 1 title "fixed, best B", \
     data using "t_s":(high("limit")) with lines ls 2 title "fixed, B = 64", \
     data using "t_s":(adaptive("limit")) with lines ls 3 title adaptive_title
set yrange [0:*]
set ylabel "adaptive: latency baseline (ms)"
plot data using "t_s":(adaptive("baseline_ms")) with lines ls 3 title "the baseline its rules compare the mean hold with"
unset multiplot
