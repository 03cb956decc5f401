"""Models, benchmark data sets and loaders used by ppl_sgmcmc examples and experiments."""
