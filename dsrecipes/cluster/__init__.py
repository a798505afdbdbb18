"""Launching dsrecipes on clusters: sbatch templates for SLURM (python -m dsrecipes.cluster.slurm)."""
