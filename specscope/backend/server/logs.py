"""Keep the token out of logs: uvicorn's access and error loggers print request paths, `?token=...` included."""
from __future__ import annotations

import logging
import re

TOKEN_QUERY = re.compile(r"(?<=[?&]token=)[^&\s\"']*")
LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    """`/ws/generate?token=s3cret&x=1` -> `/ws/generate?token=***&x=1`."""
    return TOKEN_QUERY.sub("***", text)


class RedactTokens(logging.Filter):
    """Rewrites a record's message and string arguments (uvicorn's access formatter reads the arguments one by
    one, so they stay a tuple)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def redact_tokens() -> None:
    """Install the filter on uvicorn's loggers (once)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in logger.filters):
            logger.addFilter(RedactTokens())
