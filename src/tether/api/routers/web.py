"""The chat page: ``/``, its static files from the package, and what the page must know.

Nothing is fetched from elsewhere (no CDN, no build step): the page is plain
HTML, CSS and JavaScript modules, and the Content-Security-Policy says so to
the browser too, so a stray external reference fails loudly in development.

The page follows turns with the TypeScript client, the package in
``clients/typescript`` (plain ES modules with JSDoc types: nothing to build).
Its ``src/`` is served at ``/static/client/``: ``tether/web/static/client`` is a
symbolic link to it in the source tree (so an editable install serves the
client as it is edited), and a wheel or sdist holds a copy of its files
(package data ``web/static/client/*.js``; setuptools follows the link).

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
_CLIENT = _STATIC / "client"
_JS = "text/javascript; charset=utf-8"
# Only these names are served: a fixed list leaves no path to traverse.
_TYPES = {
    "index.html": "text/html; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "app.js": _JS,
    "follow.js": _JS,
    "render.js": _JS,
    "store.js": _JS,
    "words.js": _JS,
}
# The client's modules, as listed once at start-up: likewise no path to traverse.
# (A checkout without the link, or a package built without the files, serves
# the API still; the page then says in the browser's console what is missing.)
_CLIENT_MODULES = (
    frozenset(
        entry.name for entry in _CLIENT.iterdir() if entry.is_file() and entry.name.endswith(".js")
    )
    if _CLIENT.is_dir()
    else frozenset()
)
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


@router.get("/static/client/{name}")
async def client_module(name: str) -> Response:
    """A module of the TypeScript client, which the page imports."""
    if name not in _CLIENT_MODULES:
        raise HTTPException(404, f"no client module {name!r}")
    return Response((_CLIENT / name).read_bytes(), media_type=_JS, headers=_HEADERS)


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
