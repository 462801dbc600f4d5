"""``/docs``: the Swagger UI of ``/openapi.json``, from the vendored ``swagger-ui-dist`` (no
network), and its OAuth2 redirect page."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse

DOCS = "/docs"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"
ASSETS = "/console/static/vendor/swagger-ui"

router = APIRouter(include_in_schema=False)


@router.get(DOCS)
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=request.app.openapi_url or "/openapi.json",
        title=f"{request.app.title} - Swagger UI",
        swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
        swagger_css_url=f"{ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        oauth2_redirect_url=OAUTH2_REDIRECT,
        swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from swagger.io
    )


@router.get(OAUTH2_REDIRECT)
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()
