"""dsrecipes.training.reporting: what a run reports as it trains: the loggers (JSONL, TensorBoard, W&B), the
progress line, throughput and MFU, and the loss-curve PNG."""
