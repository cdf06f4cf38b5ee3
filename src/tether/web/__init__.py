"""The chat page's static files (package data, served by ``tether.api.routers.web``)."""
