"""dsrecipes.data_efficiency: curriculum learning, data analysis, random-LTD (installed from data_efficiency/).

Import as `dsrecipes.data_efficiency`. A plain Python library usable without Hydra; nothing has landed yet.
"""
