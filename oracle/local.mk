# oracle/: the float64 model of every grouped GEMM op and its derived error bounds (oracle/oracle.h), the MLP's
# values and bounds (oracle/oracle_mlp.h), plus the seeded test-data helpers; linked by the tests, the fuzzer,
# the benchmarks and the CLI (`compare`, `--bound-out`).
noinst_LTLIBRARIES += oracle/liboracle.la
oracle_liboracle_la_SOURCES = oracle/oracle.c oracle/oracle.h oracle/fp8_oracle.c oracle/oracle_fp8.h oracle/mlp_bound.c oracle/oracle_mlp.h
