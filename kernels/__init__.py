"""dsrecipes.kernels: Triton kernels with pure-torch references (installed from the top-level kernels/).

Import as `dsrecipes.kernels`, never as `kernels`. Depends on torch and triton only.
No kernels have landed yet; the models use torch ops (SDPA, torch norms) until they do.
"""
