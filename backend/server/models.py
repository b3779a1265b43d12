"""`/api/models`: the models directory (`serve --models DIR`) and switching the one served model.

The host loads the chosen folder into a new Engine off the event loop, then hands it to `swap`, the app's
hook that replaces the worker's engine once running runs have finished or been cancelled. Without a models
directory the catalog is empty and only the current model is listed.
"""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException

from backend.engine.engine import Engine
from backend.model.catalog import CatalogEntry, scan
from backend.model.config import CheckpointError


class ModelHost:
    """The catalog of a models directory and the engine currently served."""

    def __init__(self, models_dir: str | Path | None, engine: Engine, build: Callable[[Path], Engine] | None,
                 swap: Callable[[Engine], None]):
        self.models_dir = Path(models_dir) if models_dir is not None else None
        self.engine = engine
        self.build = build
        self.swap = swap
        self._lock = threading.Lock()   # one switch at a time

    def describe(self) -> dict[str, Any]:
        loaded = self.engine.rt.loaded
        return {"current": loaded.name, "weights_hash": loaded.weights_hash, "family": loaded.family,
                "models": [e.to_json() for e in self.catalog()]}

    def catalog(self) -> list[CatalogEntry]:
        return scan(self.models_dir) if self.models_dir is not None else []

    def switch(self, name: str) -> dict[str, Any]:
        """Load models_dir/name and serve it; KeyError for an unknown name, CheckpointError if it cannot load."""
        entry = next((e for e in self.catalog() if e.name == name), None)
        if entry is None:
            raise KeyError(name)
        if not entry.loadable:
            raise CheckpointError(entry.error or f"{name} cannot be loaded")
        with self._lock:
            if self.engine.rt.loaded.folder != Path(entry.path):
                assert self.build is not None, "a models directory needs a build function"
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
            where = host.models_dir or "the models directory (the server was started without --models)"
            raise HTTPException(404, f"no model {name!r} in {where}") from None
        except CheckpointError as e:
            raise HTTPException(422, str(e)) from None

    return router
