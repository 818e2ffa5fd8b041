"""Billing: the user's billing projects, and for one of them its limit and what remains, the budget that
running batches hold (reservations), and its spend per day and per user as charts (with their data as
tables)."""

from __future__ import annotations

import datetime

from aiohttp import web

from corral.billing.v1 import billing_service_pb2 as cpb
from corral.billing.v1 import spend_pb2
from services.web import views
from services.web.app import BACKEND, render, session_of
from services.web.drawing import charts

DAYS_SHOWN = 30
PROJECTS_SHOWN = 200
USERS_SHOWN = 50


async def billing_page(request: web.Request) -> web.Response:
    session = session_of(request)
    backend = request.app[BACKEND]
    member = "" if session.who.is_admin else session.who.username
    listed = await session.calls.call(backend.billing.ListBillingProjects, cpb.ListBillingProjectsRequest(
        member=member, page_size=PROJECTS_SHOWN))
    projects = [p.name for p in listed.billing_projects]
    chosen = request.query.get("project", "")[:100] or (projects[0] if projects else "")
    if not chosen:
        return render(request, "billing.html", title="Billing", projects=[], chosen="", project=None)
    today = datetime.datetime.now(datetime.timezone.utc).date()
    first = (today - datetime.timedelta(days=DAYS_SHOWN - 1)).isoformat()
    project, days, users = await session.calls.gather(
        session.calls.call(backend.billing.GetBillingProject, cpb.GetBillingProjectRequest(billing_project=chosen)),
        session.calls.call(backend.billing.GetSpend, cpb.GetSpendRequest(
            billing_project=chosen, first_day=first, last_day=today.isoformat(),
            breakdown=spend_pb2.SPEND_BREAKDOWN_DAY)),
        session.calls.call(backend.billing.GetSpend, cpb.GetSpendRequest(
            billing_project=chosen, breakdown=spend_pb2.SPEND_BREAKDOWN_USER)))
    project = project.billing_project
    by_day = {line.day: line.cost_micro_usd for line in days.lines}
    day_bars = [((today - datetime.timedelta(days=n)).isoformat(), 0) for n in range(DAYS_SHOWN - 1, -1, -1)]
    day_bars = [(day, by_day.get(day, 0) / 1e6) for day, _ in day_bars]
    user_bars = sorted(((line.username, line.cost_micro_usd / 1e6) for line in users.lines),
                       key=lambda bar: -bar[1])[:USERS_SHOWN]
    money = views.usd_axis
    limit = project.limit_micro_usd if project.HasField("limit_micro_usd") else None
    remaining = None if limit is None else limit - project.spend_micro_usd - project.reserved_micro_usd
    reservations = [{"batch_id": r.batch_id, "held": views.usd(r.reserved_micro_usd), "since": views.when(r.since),
                     "attempts": r.n_attempts} for r in days.reservations]
    return render(request, "billing.html", title=f"Billing: {chosen}", projects=projects, chosen=chosen,
                  project=project, limit=views.usd(limit),
                  remaining=views.usd(remaining) if remaining is not None else "no limit",
                  spend=views.usd(project.spend_micro_usd), reserved=views.usd(project.reserved_micro_usd),
                  reservations=reservations,
                  day_chart=charts.bar_chart(day_bars, title=f"Spend per day, last {DAYS_SHOWN} days (UTC)",
                                             y_format=money),
                  user_chart=charts.bar_chart(user_bars, title="Spend per user", y_format=money),
                  day_rows=[(day, money(usd)) for day, usd in day_bars if usd],
                  user_rows=[(user, money(usd)) for user, usd in user_bars])


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/billing", billing_page)
