"""dsrecipes' autotuner as a Hydra sweeper plugin (`hydra/sweeper=autotune`); see autotune_sweeper.py.

`hydra_plugins` itself has no __init__.py: it is the namespace package Hydra scans for plugins.
"""
