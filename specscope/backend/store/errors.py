"""Errors raised by the store: a malformed event stream, a run id clash, an unknown run, a database that does not
answer."""
from __future__ import annotations


class StoreError(Exception):
    """Base class of every store error."""


class TraceError(StoreError, ValueError):
    """An event or event stream breaks trace schema v1."""


class SeqGapError(TraceError):
    """An event arrived with a seq past the next expected one: events were lost."""


class DuplicateSeqError(TraceError):
    """An event arrived with a seq already seen for its run."""


class RunExistsError(StoreError):
    """A run with this id is already stored."""


class UnknownRunError(StoreError, LookupError):
    """No such run (or, for writes, no such run being recorded)."""


class DocumentError(StoreError, ValueError):
    """An export document does not have the expected structure."""


class StoreUnavailable(StoreError):
    """The database does not answer (stopped, restarting, unreachable); what was taken is kept and stored later."""
