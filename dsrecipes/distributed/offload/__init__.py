"""ZeRO-Infinity: NVMe offload of optimizer states and parameter shards (zero.offload_optimizer /
zero.offload_param = nvme, stage 3, on FSDP2).

    aio.py                asynchronous positional file I/O (thread pool, O_DIRECT, DeepSpeed's aio keys)
    swap_file.py          scratch swap files (preallocated, unlinked at once) and the nvme_path check
    optimizer_swapper.py  NVMeOptimizer: optimizer state streamed through a fixed buffer pool per step
    param_swapper.py      ParameterSwapper: FSDP2 shards swapped in before their all-gather, out after
    plan.py               per-rank bytes on device, host and NVMe (the estimator's model; start-up checks)
"""
