"""The playground: a static page at `/` (HTML, CSS and vanilla JavaScript in service/static, no build
step, nothing fetched from elsewhere) that tries the served models through the public /v1 API only.
`BERTH_PLAYGROUND=false` leaves it out, so `/` answers 404 like any unknown path."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
# The page loads only its own files and talks only to this origin.
CSP = "default-src 'self'; img-src 'self' data:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"


def install_playground(app: FastAPI) -> None:
    @app.get("/", include_in_schema=False)
    async def playground() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Content-Security-Policy": CSP})

    app.mount("/playground", StaticFiles(directory=STATIC), name="playground")
