# Every variant relative to the minimal floor, per scenario: throughput, and
# the minimal floor's server CPU per request over the variant's (what a CPU-bound
# server's throughput ratio would be, much less moved by other load).
# data: datadir/scenarios.dat and datadir/scenarios_cpu.dat (report.py).
set terminal pngcairo noenhanced size 1000,640 font ",10"
set output out
set multiplot layout 2,1
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set yrange [0:*]
set grid ytics
set key outside right top vertical
set ylabel "× minimal floor"
set title "Throughput relative to the minimal floor (median of rounds)"
plot for [i=2:6] datadir."/scenarios.dat" using i:xtic(1) title columnheader(i)
set title "Minimal floor's server CPU per request / the variant's (higher is cheaper)"
plot for [i=2:6] datadir."/scenarios_cpu.dat" using i:xtic(1) title columnheader(i)
unset multiplot
