"""dsrecipes.compression: quantization-aware training, pruning, layer reduction (installed from compression/).

Import as `dsrecipes.compression`. A plain Python library usable without Hydra; nothing has landed yet.
"""
