"""The FastAPI server: REST under /api, websockets under /ws, the engine served through an EngineService (in a process
of its own under `specscope serve`)."""
from specscope.backend.server.app import create_app
from specscope.backend.server.auth import BindError, check_bind

__all__ = ["BindError", "check_bind", "create_app"]
