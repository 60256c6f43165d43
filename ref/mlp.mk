# ref/mlp.mk: the blockwise MoE MLP reference (issue 3).
