# ref/: the plain-C11 OpenMP CPU reference of every op.
libmoe_la_SOURCES += ref/routing.c ref/gemm_naive.c ref/gemm_blocked.c ref/alloc_shells.c \
	ref/ref_backend.c
noinst_HEADERS += ref/moe_ref.h ref/ref_threads.h ref/ref_bf16.h
