"""The FastAPI server: REST under /api, websockets under /ws, one worker thread that owns the engine."""
from backend.server.app import create_app
from backend.server.auth import BindError, check_bind

__all__ = ["BindError", "check_bind", "create_app"]
