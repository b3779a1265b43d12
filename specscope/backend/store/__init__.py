"""Trace storage: runs and events in SQL (SQLite by default), derived rounds and KV intervals, exports."""
from specscope.backend.store.errors import (
    DocumentError,
    DuplicateSeqError,
    RunExistsError,
    SeqGapError,
    StoreError,
    StoreUnavailable,
    TraceError,
    UnknownRunError,
)
from specscope.backend.store.export import export_json, export_perfetto, import_json
from specscope.backend.store.store import LEASE_TIMEOUT_S, Store
from specscope.backend.store.tee import Tee
from specscope.backend.store.writer import StoreWriter

__all__ = ["LEASE_TIMEOUT_S", "DocumentError", "DuplicateSeqError", "RunExistsError", "SeqGapError", "Store",
           "StoreError", "StoreUnavailable", "StoreWriter", "Tee", "TraceError", "UnknownRunError", "export_json",
           "export_perfetto", "import_json"]
