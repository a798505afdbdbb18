"""dsrecipes: DeepSpeed's capabilities as declarative Hydra recipes on PyTorch-native machinery.

Two ways in, one engine underneath:

* the recipe path: ``python -m dsrecipes [+experiment=NAME] [group=option] [key=value ...]``
* the library path, like ``deepspeed.initialize``::

      engine, optimizer, dataloader, lr_scheduler = dsrecipes.initialize(model=model, config=cfg)
"""

__version__ = "0.1.0"

__all__ = ["__version__", "initialize"]


def __getattr__(name):
    # Imported lazily so that `import dsrecipes.data` (or the kernels) stays light.
    if name == "initialize":
        from dsrecipes.library import initialize

        return initialize
    raise AttributeError(f"module 'dsrecipes' has no attribute {name!r}")
