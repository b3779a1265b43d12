"""`/api/models`: the models directory (`serve --models DIR`) and switching the one served model.

The host loads the chosen folder into a new Engine off the event loop, then hands it to `swap`, the app's
hook that replaces the worker's engine once running runs have finished or been cancelled.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException

from backend.engine.engine import Engine
from backend.model.catalog import scan
from backend.model.config import CheckpointError


class ModelHost:
    """The catalog of a models directory and the engine currently served."""

    def __init__(self, models_dir: str | Path, engine: Engine, build: Callable[[Path], Engine],
                 swap: Callable[[Engine], None]):
        self.models_dir = Path(models_dir)
        self.engine = engine
        self.build = build
        self.swap = swap
        self._lock = threading.Lock()   # one switch at a time

    def describe(self) -> dict[str, Any]:
        loaded = self.engine.rt.loaded
        return {"current": loaded.name, "weights_hash": loaded.weights_hash, "family": loaded.family,
                "models": [e.to_json() for e in scan(self.models_dir)]}

    def switch(self, name: str) -> dict[str, Any]:
        """Load models_dir/name and serve it; KeyError for an unknown name, CheckpointError if it cannot load."""
        entry = next((e for e in scan(self.models_dir) if e.name == name), None)
        if entry is None:
            raise KeyError(name)
        if not entry.loadable:
            raise CheckpointError(entry.error or f"{name} cannot be loaded")
        with self._lock:
            if self.engine.rt.loaded.folder != Path(entry.path):
                engine = self.build(Path(entry.path))
                self.swap(engine)
                self.engine = engine
        return self.describe()


def models_router(host: ModelHost) -> APIRouter:
    router = APIRouter(prefix="/api")

    @router.get("/models")
    async def list_models() -> dict[str, Any]:
        return await asyncio.to_thread(host.describe)

    @router.post("/models/{name}")
    async def switch_model(name: str) -> dict[str, Any]:
        try:
            return await asyncio.to_thread(host.switch, name)
        except KeyError:
            raise HTTPException(404, f"no model {name!r} in {host.models_dir}") from None
        except CheckpointError as e:
            raise HTTPException(422, str(e)) from None

    return router
