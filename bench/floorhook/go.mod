module gpuforge.io/bench/floorhook

go 1.22
