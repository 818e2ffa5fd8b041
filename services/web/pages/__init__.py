"""Each page's handler, by what it shows: sign-in (`signin`), batches and a batch (`batches`), a job
(`jobs`), billing (`billing`) and the administrators' pages (`admin`). `add_routes` adds them all."""

from __future__ import annotations

from aiohttp import web

from services.web.pages import admin, batches, billing, jobs, signin


def add_routes(router: web.UrlDispatcher) -> None:
    for module in (signin, batches, jobs, billing, admin):
        module.add_routes(router)
