# New-key cycle latency, p50 (solid) and p99 (dashed), by client count.
set terminal pngcairo noenhanced size 1100,420 font ",10"
set output out
set multiplot layout 1,2 title "New-key cycle latency: p50 (solid) and p99 (dashed), ms"
set logscale x 2
set logscale y 10
set xtics ("1" 1, "4" 4, "16" 16)
set xrange [0.8:20]
set xlabel "clients"
set ylabel "ms"
set key top left
set grid ytics
titles = "minimal floor seed-CTE PL/pgSQL pg_idem"
do for [block=0:1] {
    set title (block == 0 ? "synchronous_commit = on" : "synchronous_commit = off")
    plot for [i=0:4] datadir."/cycle.dat" index block using 1:(column(5+5*i)) \
            with linespoints lw 2 pt 7 lc i+1 title word(titles, i+1), \
         for [i=0:4] datadir."/cycle.dat" index block using 1:(column(6+5*i)) \
            with linespoints lw 2 dt 2 pt 6 lc i+1 notitle
}
unset multiplot
