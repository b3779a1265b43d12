"""Developer scripts, each run from a checkout as `python -m tools.<name>` (tools/README.md says why each stays a
script): they sit at the top of the import layering, so they may import any package and nothing imports them."""
