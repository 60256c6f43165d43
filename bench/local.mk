# bench/: benchmarks (CPU reference here; the CUDA benchmark joins with gpu/).
EXTRA_DIST += bench/RESULTS.md
