"""The web UI in Chromium, against a real `corral up` through its public gateway (Envoy, TLS verified
against the deployment's CA): a scientist signs in, finds a batch by a query, watches it complete without
reloading, reads a failed job's log, cancels a running batch and re-runs the failed jobs of another, and
reads the spend chart; another tenant's batch URL is "not found"; a form without its CSRF token is refused;
signing out ends the session. Every page passes axe-core with no serious or critical violation, loads at most
MAX_SCRIPT_BYTES of script, and is saved as a screenshot (test-artifacts/screenshots/, shown in docs/ui.md)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect

import corral
from corral.batch.v1 import batch_pb2
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster, eventually

pytestmark = pytest.mark.timeout(300)

PASSWORDS = {"alice": "alice-password-1", "bob": "bob-password-22", "ops": "ops-password-333"}
MAX_SCRIPT_BYTES = 200 * 1024
"""The most script a page may load (the issue's bar); corral's is a few KB of its own."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A `corral up` with its gateway and web UI (the process runtime: the jobs here are shell one-liners), with
    alice (in 'default'), bob (in a project of his own) and ops (an administrator), each with a password."""
    started = up.start(tmp_path_factory.mktemp("ui"), "--gateway", "--gateway-port", "0",
                       "--internal-gateway-port", "0", "--worker-runtime", "process", "--worker-cores", "4",
                       "--max-workers", "1")
    try:
        with started.client() as admin:
            for name, roles in (("alice", ("user",)), ("bob", ("user",)), ("ops", ("user", "admin"))):
                admin.create_user(name, roles=roles, password=PASSWORDS[name])
            admin.add_member("default", "alice")
            admin.create_billing_project("bob-lab")
            admin.add_member("bob-lab", "bob")
        yield started
    finally:
        started.stop()


def client_of(cluster: Cluster, name: str) -> corral.Client:
    with cluster.client() as admin:
        _, secret = admin.create_token("ui-test", username=name)
    return cluster.client(secret)


def submit(cluster: Cluster, name: str, commands: list[str], *, chain: bool = False, user: str = "alice",
           project: str = "default") -> int:
    """A batch of shell jobs (each after the one before with `chain`, else all after the first); its id."""
    builder = corral.BatchBuilder(project, attributes={"name": name})
    first = builder.job("busybox", ["sh", "-c", commands[0]], attributes={"name": "job-0"})
    previous = first
    for i, command in enumerate(commands[1:], start=1):
        previous = builder.job("busybox", ["sh", "-c", command], attributes={"name": f"job-{i}"},
                               parents=[previous if chain else first])
    with client_of(cluster, user) as client:
        return client.submit(builder).batch_id


@pytest.fixture
def base(cluster: Cluster) -> str:
    return f"https://{cluster.endpoints['gateway']}"


@pytest.fixture
def context(new_context, cluster: Cluster) -> BrowserContext:
    return new_context(trust=Path(cluster.endpoints["ca_cert"]))


def sign_in(page: Page, base: str, name: str, path: str = "/batches") -> None:
    page.goto(base + path)
    expect(page).to_have_url(re.compile(r"/login\?next="))
    page.get_by_label("Username").fill(name)
    page.get_by_label("Password").fill(PASSWORDS[name])
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_text(f"Signed in as {name}")).to_be_visible()


def tab_to(page: Page, text: str, most: int = 40) -> None:
    """Press Tab until the focused element is the link or button `text`, as someone without a mouse does."""
    for _ in range(most):
        page.keyboard.press("Tab")
        if page.evaluate("document.activeElement.textContent.trim()") == text:
            return
    raise AssertionError(f"{text!r} cannot be reached with Tab")


def check(page: Page, name: str, assert_accessible, screenshot, script_bytes) -> None:
    """The bars every page meets: accessible, little script, and a screenshot."""
    assert_accessible(page, name)
    assert script_bytes(page) <= MAX_SCRIPT_BYTES
    screenshot(page, name)


def test_sign_in_with_the_keyboard_and_find_a_batch_by_a_query(cluster, context, base, assert_accessible,
                                                                 screenshot, script_bytes) -> None:
    batch_id = submit(cluster, "lookup-alignment", ["echo found"])
    page = context.new_page()
    page.goto(base + "/")
    check(page, "login", assert_accessible, screenshot, script_bytes)
    page.keyboard.press("Tab")
    expect(page.get_by_role("link", name="Skip to content")).to_be_focused()
    page.get_by_label("Username").focus()
    page.keyboard.type("alice")
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORDS["alice"])
    page.keyboard.press("Enter")
    expect(page.get_by_text("Signed in as alice")).to_be_visible()
    page.get_by_label("Find batches").fill("name=~lookup")
    page.get_by_label("Find batches").press("Enter")
    expect(page).to_have_url(re.compile(r"/batches\?q=name"))
    expect(page.get_by_role("link", name=str(batch_id), exact=True)).to_be_visible()
    check(page, "batches", assert_accessible, screenshot, script_bytes)
    page.get_by_label("Find batches").fill("state=running cost>>1")
    page.get_by_label("Find batches").press("Enter")
    error = page.get_by_role("alert")
    expect(error).to_contain_text("at character 19")
    expect(page.locator(".query-error mark")).to_have_text(">")
    check(page, "batches-query-error", assert_accessible, screenshot, script_bytes)


def test_a_batch_completes_live_with_its_dag_and_timeline(cluster, context, base, assert_accessible, screenshot,
                                                           script_bytes) -> None:
    batch_id = submit(cluster, "watched", ["sleep 4; echo first"] + [f"echo child {i}" for i in range(6)])
    page = context.new_page()
    sign_in(page, base, "alice", f"/batches/{batch_id}")
    page.evaluate("window.corralMarker = 'not reloaded'")
    counts = page.locator("[data-live-counts]")
    expect(counts.locator('[data-count="succeeded"]')).to_have_text("7", timeout=90_000)
    expect(page.locator("[data-live-note]")).to_have_text("This batch is complete.")
    assert page.evaluate("window.corralMarker") == "not reloaded"  # the counts came live, not by a reload
    page.reload()
    expect(page.locator("figure[data-svg-src$='dag.svg'] svg")).to_be_visible()
    expect(page.locator("figure[data-svg-src$='timeline.svg'] svg")).to_be_visible()
    assert page.locator("figure[data-svg-src$='dag.svg'] svg a").count() == 7  # a link to each job
    check(page, "batch", assert_accessible, screenshot, script_bytes)


def test_a_failed_jobs_log_and_its_rerun(cluster, context, base, assert_accessible, screenshot,
                                          script_bytes) -> None:
    batch_id = submit(cluster, "fails", ["echo ok", "echo 'boom: no such file' >&2; exit 3"])
    with client_of(cluster, "alice") as alice:
        eventually(lambda: alice.get_batch(batch_id).state == batch_pb2.BATCH_STATE_COMPLETE, 90,
                   what="the batch to complete")
    page = context.new_page()
    sign_in(page, base, "alice", f"/batches/{batch_id}?jobs=state%3Dfailed")
    page.get_by_role("link", name="2", exact=True).click()
    expect(page.locator("pre.log")).to_contain_text("boom: no such file")
    expect(page.get_by_role("cell", name="exited")).to_be_visible()
    check(page, "job-failed", assert_accessible, screenshot, script_bytes)
    page.get_by_role("link", name=f"Batch {batch_id}").click()
    page.get_by_role("link", name="Re-run the failed jobs…").click()
    check(page, "confirm-rerun", assert_accessible, screenshot, script_bytes)
    page.get_by_role("button", name="Re-run the failed jobs").click()
    expect(page.get_by_role("status")).to_contain_text("The failed jobs run again")
    expect(page.locator('[data-count="total"]')).to_have_text("3")


def test_follow_a_running_jobs_log_then_cancel_its_batch(cluster, context, base, assert_accessible, screenshot,
                                                          script_bytes) -> None:
    batch_id = submit(cluster, "long", ["i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.5; done",
                                        "echo never"])
    page = context.new_page()
    sign_in(page, base, "alice", f"/batches/{batch_id}")
    expect(page.locator('[data-count="running"]')).to_have_text("1", timeout=60_000)
    page.goto(f"{base}/batches/{batch_id}/jobs/1")
    page.evaluate("window.corralMarker = 'not reloaded'")
    log = page.locator("pre.log")
    served = [int(n) for n in re.findall(r"tick (\d+)", log.text_content() or "")]
    later = f"tick {max(served, default=0) + 4}"  # written after the page was served: only the live tail has it
    expect(log).to_contain_text(later, timeout=30_000)
    assert page.evaluate("window.corralMarker") == "not reloaded"
    expect(page.get_by_role("heading", name="What the scheduler says")).to_be_visible()  # ExplainJob
    expect(page.locator("ul.reasons")).to_contain_text("running on")
    check(page, "job-running", assert_accessible, screenshot, script_bytes)
    page.goto(f"{base}/batches/{batch_id}/jobs/2")
    expect(page.get_by_role("heading", name="Why is it not running?")).to_be_visible()
    expect(page.locator("ul.reasons")).to_contain_text("waiting on parents")
    check(page, "job-waiting", assert_accessible, screenshot, script_bytes)
    page.goto(f"{base}/batches/{batch_id}")
    tab_to(page, "Cancel the batch…")  # with the keyboard alone, to the end
    page.keyboard.press("Enter")
    expect(page.get_by_text("This cannot be undone")).to_be_visible()
    check(page, "confirm-cancel", assert_accessible, screenshot, script_bytes)
    tab_to(page, "Cancel the batch")
    page.keyboard.press("Enter")
    expect(page.get_by_role("status")).to_contain_text("The batch was cancelled")
    expect(page.locator('[data-count="cancelled"]')).to_have_text("2", timeout=60_000)


def test_billing_shows_the_spend_chart(cluster, context, base, assert_accessible, screenshot,
                                       script_bytes) -> None:
    page = context.new_page()
    sign_in(page, base, "alice", "/billing")
    expect(page.get_by_role("img", name=re.compile("Spend per day"))).to_be_visible()
    expect(page.get_by_role("img", name=re.compile("Spend per user"))).to_be_visible()
    expect(page.get_by_text("Remaining")).to_be_visible()
    check(page, "billing", assert_accessible, screenshot, script_bytes)


def test_another_tenants_batch_is_not_found(cluster, context, base, assert_accessible, screenshot,
                                            script_bytes) -> None:
    batch_id = submit(cluster, "alice-only", ["echo mine"])
    page = context.new_page()
    sign_in(page, base, "bob")
    answer = page.goto(f"{base}/batches/{batch_id}")
    assert answer is not None and answer.status == 404
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    expect(page.get_by_text("alice-only")).to_have_count(0)
    check(page, "not-found", assert_accessible, screenshot, script_bytes)
    assert page.goto(f"{base}/admin").status == 403  # type: ignore[union-attr]


def test_a_form_without_its_csrf_token_is_refused(cluster, context, base) -> None:
    batch_id = submit(cluster, "kept", ["sleep 600"])
    page = context.new_page()
    sign_in(page, base, "alice", f"/batches/{batch_id}/cancel")
    page.locator("main input[name=csrf]").evaluate("input => input.remove()")
    page.get_by_role("button", name="Cancel the batch").click()
    expect(page.get_by_text("This form was refused")).to_be_visible()
    posted = page.evaluate("""url => fetch(url, {method: "POST", body: new URLSearchParams({csrf: "forged"})})
                                      .then(response => response.status)""", f"{base}/batches/{batch_id}/cancel")
    assert posted == 403
    page.goto(f"{base}/batches/{batch_id}")
    expect(page.get_by_role("link", name="Cancel the batch…")).to_be_visible()  # still running
    with client_of(cluster, "alice") as alice:
        alice.cancel_batch(batch_id)


def test_the_administrator_pages_and_signing_out(cluster, context, base, assert_accessible, screenshot,
                                                  script_bytes) -> None:
    page = context.new_page()
    sign_in(page, base, "ops", "/admin")
    for heading in ("Users", "Billing projects", "Pools", "Instances", "Images"):
        expect(page.get_by_role("heading", name=heading, exact=True)).to_be_visible()
    expect(page.get_by_role("cell", name="bob-lab")).to_be_visible()
    check(page, "admin", assert_accessible, screenshot, script_bytes)
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/login$"))
    page.goto(f"{base}/admin")
    expect(page).to_have_url(re.compile(r"/login\?next="))
    cookies = {c["name"]: c for c in context.cookies()}
    assert "__Host-corral-session" not in cookies
