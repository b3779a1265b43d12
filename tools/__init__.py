"""Developer scripts, each run from a checkout as `python -m tools.<name>` (benchmarks, checks, training and data
generation): they sit at the top of the import layering, so they may import any package and no package imports
them, and they are not shipped in the wheel (the installed command is `specscope`)."""
