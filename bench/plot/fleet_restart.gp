# bench/plot/fleet_restart.gp: a fleet's committed calls per second and how many of its instances were served, per
# 100 ms, while PgBouncer is restarted under the load (docs/pgbouncer.md, docs/performance.md).
#   gnuplot -e "data='bench/results/fleet-STAMP-restart.csv'; out='docs/figures/fleet_restart.png'; stop=S; up=U" \
#       bench/plot/fleet_restart.gp
# S and U: seconds into the run when PgBouncer was stopped and when it answered again (the CSV's first line).
# (scripts/bench-fleet runs it.)
set datafile separator ","
set datafile columnheaders
set terminal pngcairo size 900,400 font "sans,10" noenhanced
set output out
set grid lc rgb "#dddddd"
set key bottom right box opaque
set xlabel "seconds into the run"
set ylabel "committed calls per second (100 ms bins)"
set y2label "instances that committed a call in the bin"
set y2range [0:9]
set y2tics 0,1,8
set ytics nomirror
set yrange [0:*]
set arrow from stop, graph 0 to stop, graph 1 nohead lc rgb "#d62728" dt 2 lw 2
set arrow from up, graph 0 to up, graph 1 nohead lc rgb "#2ca02c" dt 2 lw 2
set label "PgBouncer stopped" at stop, graph 0.95 right offset -0.5,0 tc rgb "#d62728"
set label "answering again" at up, graph 0.88 left offset 0.5,0 tc rgb "#2ca02c"
set title "8 instances x pool 10 through PgBouncer (transaction pooling, 10 server connections): a restart under load"
plot data using "t_s":"committed_per_s" with steps lw 2 lc rgb "#1f77b4" title "committed/s", \
     data using "t_s":"instances_served" axes x1y2 with steps lw 1.5 lc rgb "#ff7f0e" title "instances served"
