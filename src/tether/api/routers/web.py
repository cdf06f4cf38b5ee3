"""The chat page: ``/``, its static files from the package, and what the page must know.

Nothing is fetched from elsewhere (no CDN, no build step): the page is plain
HTML, CSS and JavaScript modules, and the Content-Security-Policy says so to
the browser too, so a stray external reference fails loudly in development.

Everything else the page does goes through the public HTTP API (design §3).
The one addition is ``GET /web/config``: which credential the page should ask
for, and which agents it can offer, neither of which the API says.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response
from pydantic import BaseModel

from tether.api.auth import HeaderAuthenticator
from tether.api.identity import request_identity
from tether.handlers.chat_handler import ChatHandler
from tether.handlers.errors import TurnRequestError

router = APIRouter(include_in_schema=False)

_STATIC = files("tether.web") / "static"
_JS = "text/javascript; charset=utf-8"
# Only these names are served: a fixed list leaves no path to traverse.
_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "app.js": _JS,
    "api.js": _JS,
    "follow.js": _JS,
    "render.js": _JS,
    "sse.js": _JS,
    "store.js": _JS,
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; form-action 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # Served from the installed package: revalidate so an upgrade shows at once.
    "Cache-Control": "no-cache",
}


class PageConfig(BaseModel):
    """What the page asks before anything else."""

    auth: str
    """``headers``: the page sends a user name as ``requester-uuid``;
    ``token``: it sends ``Authorization: Bearer``."""
    agents: list[str] | None
    """The agents to offer, or None until the request proves an identity (with
    a token, agent names are not shown to anonymous visitors)."""


def _file(name: str) -> Response:
    media_type = _TYPES.get(name)
    if media_type is None:
        raise HTTPException(404, f"no static file {name!r}")
    return Response((_STATIC / name).read_bytes(), media_type=media_type, headers=_HEADERS)


@router.get("/")
async def index() -> Response:
    """The chat page."""
    return _file("index.html")


@router.get("/static/{name}")
async def static(name: str) -> Response:
    """A file of the chat page."""
    return _file(name)


@router.get("/web/config", response_model=PageConfig)
async def page_config(request: Request) -> PageConfig:
    """The credential the page asks for, and the agents it offers."""
    authenticator = getattr(request.app.state, "authenticator", None)
    auth = (
        "headers"
        if authenticator is None or isinstance(authenticator, HeaderAuthenticator)
        else "token"
    )
    try:
        request_identity(request)
    except TurnRequestError:
        return PageConfig(auth=auth, agents=None)
    handler: ChatHandler = request.app.state.chat_handler
    setups = await handler.registries.list_setups()
    return PageConfig(auth=auth, agents=[setup.agent_identifier for setup in setups])
