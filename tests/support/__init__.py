"""Helpers shared by several test modules (test modules never import each other). tests/ is on sys.path (pytest's
rootdir conftest), so a module imports them as `from support.spiffy import graph_json`."""
