# New-key cycle throughput by client count, synchronous_commit on and off.
# data: datadir/cycle.dat (report.py); out: the PNG.
set terminal pngcairo noenhanced size 1100,420 font ",10"
set output out
set multiplot layout 1,2 title "New-key cycle (claim + finalize): requests/s, median of rounds (bars: min..max)"
set logscale x 2
set xtics ("1" 1, "4" 4, "16" 16)
set xrange [0.8:20]
set xlabel "clients"
set ylabel "requests/s"
set yrange [0:*]
set key top left
set grid ytics
titles = "minimal floor seed-CTE PL/pgSQL pg_idem"
do for [block=0:1] {
    set title (block == 0 ? "synchronous_commit = on" : "synchronous_commit = off")
    plot for [i=0:4] datadir."/cycle.dat" index block \
        using ($1*(1+0.04*(i-2))):(column(2+5*i)):(column(3+5*i)):(column(4+5*i)) \
        with yerrorlines lw 2 pt 7 title word(titles, i+1)
}
unset multiplot
