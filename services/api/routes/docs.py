"""/docs and /redoc served with their assets from an installed package, so they work with no
network (FastAPI's default pages load Swagger UI and ReDoc from a CDN)."""

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = Path(fastapi_offline.__file__).resolve().parent / "static"
ASSETS_URL = "/docs-assets"

router = APIRouter(include_in_schema=False)


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} API",
        swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        # Swagger UI's validator badge is an image from validator.swagger.io.
        swagger_ui_parameters={"validatorUrl": None},
    )


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    return get_redoc_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} API",
        redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        with_google_fonts=False,
    )


router.mount(ASSETS_URL, StaticFiles(directory=ASSETS), name="docs-assets")
