# ref/mlp.mk: the blockwise MoE MLP reference (issue 3).
include_HEADERS += include/moe_mlp.h
libmoe_la_SOURCES += src/mlp_api.c ref/mlp.c ref/mlp_layout.c
noinst_HEADERS += ref/mlp_ref.h
EXTRA_DIST += specs/MLP.md
