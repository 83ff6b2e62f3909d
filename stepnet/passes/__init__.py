"""Analyses and rewrites that read operator records: the backward pass (gradients), static shape and dtype
inference (shapes), data-parallel training (data_parallel). Each rewrite returns a new net."""
