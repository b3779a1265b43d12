"""`/api/models`: the models directory (`serve --models DIR`) and switching the one served model.

The host asks the engine service, off the event loop, to load the chosen folder and serve it once running runs
have been cancelled. The catalog lists the models known by name (the default chat model, tiny) and, with a
models directory, its folders.
"""
from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException

from specscope.backend.model.catalog import CatalogEntry, builtin, scan
from specscope.backend.model.config import CheckpointError
from specscope.backend.server.service import EngineService


class ModelHost:
    """The catalog of a models directory and the engine currently served."""

    def __init__(self, models_dir: str | Path | None, engine: EngineService):
        self.models_dir = Path(models_dir) if models_dir is not None else None
        self.engine = engine
        self._lock = threading.Lock()   # one switch at a time

    def describe(self) -> dict[str, Any]:
        model = self.engine.model
        return {"current": model.name, "weights_hash": model.weights_hash, "family": model.family,
                "matmul": model.matmul,
                "models": [e.to_json() for e in self.catalog()]}

    def catalog(self) -> list[CatalogEntry]:
        """The models known by name, then the models directory's folders."""
        return builtin() + (scan(self.models_dir) if self.models_dir is not None else [])

    def switch(self, name: str) -> dict[str, Any]:
        """Serve a listed model (a built-in by name, else models_dir/name); KeyError for an unknown name,
        CheckpointError if it cannot load."""
        entry = next((e for e in self.catalog() if e.name == name), None)
        if entry is None:
            raise KeyError(name)
        if not entry.loadable:
            raise CheckpointError(entry.error or f"{name} cannot be loaded")
        with self._lock:
            served = self.engine.model
            if served.name.split("+")[0] != entry.name or (not entry.builtin and served.folder != Path(entry.path)):
                self.engine.switch(entry.name if entry.builtin else Path(entry.path))
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
