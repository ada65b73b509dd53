# bench/plot/pg_common.gp: settings shared by the PostgreSQL load plots
# (loaded by pg_goodput.gp, pg_p99.gp and pg_spike.gp; not run on its own).
set datafile separator ","
set datafile columnheaders
set terminal pngcairo size 760,430 font "sans,10" noenhanced
set grid lc rgb "#dddddd"
set key top left box opaque
# One colour per arm, the same in every figure.
set style line 1 lc rgb "#1f77b4" lw 2 pt 7 ps 0.8   # gate
set style line 2 lc rgb "#d62728" lw 2 pt 5 ps 0.8   # pool-many
set style line 3 lc rgb "#555555" lw 2 pt 9 ps 0.8   # raw
set style line 4 lc rgb "#2ca02c" lw 2 pt 13 ps 0.8  # pool
set style line 9 lc rgb "#999999" lw 1 dt 2          # reference lines
# The value of column `col` in rows of `arm` on the pg_sleep workload (not the probe run); NaN elsewhere.
sleep_row(arm, col) = (strcol("workload") eq "sleep" && strcol("arm") eq arm && column("probe") == 0) ? column(col) : NaN
