"""The web UI (`python -m services.web`): corral for people in a browser, behind the public gateway at `/`.

A stateless aiohttp service that renders HTML on the server (Jinja2 templates) and calls the frontend and
auth over gRPC with the signed-in user's own token: it holds no privilege over anyone's data. Several
replicas may run side by side: a session is the user's token in a cookie, nothing is kept between requests
but caches.

- `app`: the aiohttp application, its security headers and its routes; `serve` runs it.
- `backend`: the gRPC channels, and the calls made as one user (`UserCalls`).
- `sessions`: the session cookie and the CSRF tokens derived from it.
- `pages`: each page's handler (batches, a batch, a job, billing, admin, sign-in).
- `live`: the server-sent event streams (a batch's counts, a job's log).
- `views`: what the templates show, formatted (money, durations, states).
- `drawing`: the DAG, the timeline and the charts, as SVG.
"""
