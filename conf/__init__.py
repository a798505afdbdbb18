"""Hydra config groups of dsrecipes, installed as the package dsrecipes.conf (found via pkg://dsrecipes.conf)."""
