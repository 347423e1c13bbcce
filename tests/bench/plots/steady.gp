# Steady state: idem_keys' size against three times its live rows' size.
# data: t table_MiB index_MiB 3xlive_MiB live_MiB dead_rows; warmup, phase: seconds.
set terminal pngcairo noenhanced size 1000,420 font ",10"
set output out
set title sprintf("Steady state (%s): idem_keys size; warm-up to %ds, long transaction from %ds to %ds", name, warmup, warmup+phase, warmup+2*phase)
set xlabel "seconds"
set ylabel "MiB"
set y2label "dead rows"
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:*]
set key top left
set grid ytics
set object 1 rect from 0, graph 0 to warmup, graph 1 fc rgb "#eeeeee" fs solid 0.5 behind
set object 2 rect from warmup+phase, graph 0 to warmup+2*phase, graph 1 fc rgb "#f0e0e0" fs solid 0.5 behind
plot data using 1:($2+$3) with lines lw 2 title "table + index", \
     data using 1:2 with lines lw 1 title "table", \
     data using 1:3 with lines lw 1 title "index", \
     data using 1:4 with lines lw 2 dt 2 title "3 × live rows' size (target bound)", \
     data using 1:6 axes x1y2 with lines lw 1 lc rgb "#888888" title "dead rows (right axis)"
