"""The UI tabs, one module each."""
