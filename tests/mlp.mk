# tests/mlp.mk: tests of the blockwise MoE MLP reference (issue 3).
