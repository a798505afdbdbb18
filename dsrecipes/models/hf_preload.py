"""Imported by a fork server's preload when the recipe runs a Hugging Face module (model.style=hf): transformers'
model machinery once in the server instead of once per worker (about 2 s of CPU each). Nothing when transformers
is not installed (the recipe's checks have already said so)."""

try:
    import transformers.modeling_utils  # noqa: F401
    import transformers.models.auto.modeling_auto  # noqa: F401
except ImportError:  # the `hf` extra is absent: validation refuses model.style=hf before any spawn
    pass
