# WAL per request, per scenario and variant.
# data: datadir/wal.dat (report.py).
set terminal pngcairo noenhanced size 1000,420 font ",10"
set output out
set title "WAL per request (bytes), median of rounds"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set yrange [0:*]
set grid ytics
set key outside right top vertical
set ylabel "bytes / request"
plot for [i=2:6] datadir."/wal.dat" using i:xtic(1) title columnheader(i)
