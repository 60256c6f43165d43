# cli/: the moe command-line tool (issue 6): libmoe's ops on NumPy .npy files, and `moe compare`.
# -static links libmoe into the program (libtool: no uninstalled shared library, so no wrapper script
# in the build tree; a run starts in milliseconds, which the many short runs of make check need).
bin_PROGRAMS += cli/moe
cli_moe_SOURCES = cli/main.c cli/options.c cli/options.h cli/cli.h cli/memory.c cli/files.c cli/arrays.c \
	cli/call.c cli/layouts.c cli/layouts.h cli/cmd_gemm.c cli/cmd_fp8.c cli/cmd_fp8_dw.c cli/cmd_route.c cli/cmd_mlp.c cli/cmd_compare.c \
	cli/cmd_autotune.c cli/run_options.c cli/mlp_affinities.c cli/dtype_fit.c cli/bounds.c \
	cli/npy.c cli/npy.h cli/outputs.c cli/outputs.h
cli_moe_CPPFLAGS = $(AM_CPPFLAGS)
cli_moe_LDADD = libmoe.la oracle/liboracle.la -lm
cli_moe_LDFLAGS = $(AM_LDFLAGS) -static
# --backend cuda: device copies of each call's arrays (cli/device.c), only when CUDA is configured
if MOE_CUDA
cli_moe_SOURCES += cli/device.c cli/device.h
cli_moe_CPPFLAGS += $(CUDA_CPPFLAGS) -DMOE_CLI_CUDA
cli_moe_LDADD += $(CUDA_LIBS)
endif
EXTRA_DIST += cli/README.md cli/device.c cli/device.h
