# Growth: pg_idem over its baseline against the number of clients.
# data: blocks "clients ratio" for cycle, replay, hot key (blank-line separated).
set terminal pngcairo noenhanced size 900,420 font ",10"
set output out
set title "pg_idem / baseline by number of clients (1.0 = the bare statements)"
set xlabel "clients"
set ylabel "throughput ratio"
set logscale x 2
set yrange [0:*]
set key bottom left
set grid
plot data index 0 using 1:2 with linespoints lw 2 title "new-key cycle / minimal floor", \
     data index 1 using 1:2 with linespoints lw 2 title "replay / bare SELECT", \
     data index 2 using 1:2 with linespoints lw 2 title "hot key / bare SELECT", \
     1 with lines dt 2 lc rgb "#888888" title ""
