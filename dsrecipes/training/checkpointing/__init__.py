"""dsrecipes.training.checkpointing: checkpoints on disk (atomic, complete-marked, retained), the Engine's
save / load through torch.distributed.checkpoint, and DeepSpeed checkpoints read, loaded and converted."""
