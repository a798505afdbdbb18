"""Inference: text generation from trained models."""
