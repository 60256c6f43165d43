# proptest/: the float64 oracle and error bounds (used by tests/ and bench/), and the property tests.
noinst_LTLIBRARIES += proptest/liboracle.la
proptest_liboracle_la_SOURCES = proptest/oracle.c proptest/oracle.h
