"""What several test files share (imported as tests.helpers.<module>; test files import nothing from each other).

* distributed: run a function on N local gloo processes with a timeout (DeepSpeed's DistributedTest idea).
* cli: run `python -m dsrecipes ...` offline in a folder.
* equivalence: the small recipe the layout tests train through the CLI, reading its losses and
  export, and the assertions that a layout reproduces (or resumes) the single-process run.
* generation: the no-cache greedy reference for generation tests.
* wandb_records: a reader of offline W&B run files.
"""
