# src/: the library's front door: argument validation, error messages, backend dispatch.
noinst_HEADERS += src/gemm_prepare.h
libmoe_la_SOURCES += src/errors.c src/dtype.c src/arrays.c src/dispatch.c src/gemm_api.c src/routing_api.c src/autotune.c
