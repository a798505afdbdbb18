"""dsrecipes.training.optim: the optimizers (AdamW / Adam / LAMB / Lion and their fused and multi-tensor paths,
the 1-bit family: 1-bit Adam, 0/1 Adam, 1-bit LAMB), a client optimizer rebuilt after sharding, and the learning-rate
schedules (DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR / OneCycle / LRRangeTest and the recipe's own)."""
