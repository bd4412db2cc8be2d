"""The approvals console (``/ui``) in a real browser: headless Chromium from
Debian's packages, driven by Selenium through chromedriver, against a proxy in
front of real PostgreSQL with real LangGraph (Python, and LangGraph.js when node
is installed) running through it.

The browser logs in with the admin token, sees a parked approval appear on
*Waiting* without a reload, sees it move to *Answered* with its approver once
LangGraph answers it, sees a racer refused and a late duplicate on *Refused*, a
fork on *Forks served*, a write refused by a channel rule on *Writes rejected*, a
replayed write on *Writes fenced* (holder and epoch), releases a held claim from *Claims held* (confirmed,
CSRF-checked, audited), and opens the thread's page (the timeline drawn, the
chain verified). Each page is saved as a screenshot under
``target/console-screenshots/``. Without the token, ``/ui`` and the data routes
answer 401, and ``/metrics`` on ``[admin] metrics_listen`` answers without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.types import Command

import lg_enforce as E
import lg_scenarios as L
from conftest import HOST, free_port
from test_admin import TOKEN, http, wait_admin
from test_validity import ITEMS_RULE, write_rules_dir

pytestmark = pytest.mark.timeout(300)

HERE = Path(__file__).resolve().parent
SHOTS = HERE.parent / "target" / "console-screenshots"
CHROMIUM = os.environ.get("RG_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("RG_CHROMEDRIVER", "/usr/bin/chromedriver")
JS_DIR = HERE / "js"
NODE = os.environ.get("RG_NODE") or shutil.which("node")
# What the browser is allowed: no network of its own, no first-run work.
CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync",
                  "--window-size=1360,900")
# How soon a parked approval must show on an open Waiting page (it polls).
APPEAR_WITHIN_S = 2.0


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (integration/requirements.txt)"
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is missing (Debian: apt-get install chromium chromium-driver)"
    return None


MISSING = _browser_missing()
if MISSING and os.environ.get("CI"):
    raise RuntimeError(f"test_console under CI: {MISSING}")


@pytest.fixture(scope="module")
def lg_db(pg, dbname):
    """The module's database with the LangGraph tables."""
    L.setup_db("conn", pg.dsn(dbname))
    return dbname


@pytest.fixture(scope="module")
def console(proxy_factory, workdir, pg, lg_db):
    """A proxy with the token, a metrics listener, consume-once (racers refused at
    once), approvers named by ``/by`` in the answer, and values in the trail."""
    port, metrics_port = free_port(), free_port()
    cfg = workdir / "console.toml"
    cfg.write_text(
        f'admin_listen = "{HOST}:{port}"\n\n'
        f'[admin]\ntoken = "{TOKEN}"\nmetrics_listen = "{HOST}:{metrics_port}"\n\n'
        f'[audit]\napprover_pointers = ["/by"]\nlog_values = true\n\n'
        f'[claims]\nlapse_ms = 60000\n'
        f'policy = "refuse"\n')
    rules = write_rules_dir(workdir / "console-rules", {"items.toml": ITEMS_RULE})
    proxy = proxy_factory("--config", str(cfg), "--rules", str(rules), name="console")
    base = wait_admin(port)
    metrics = wait_admin(metrics_port)
    return type("Console", (), {"proxy": proxy, "base": base, "metrics": metrics,
                                "dsn": proxy.dsn(lg_db), "db": lg_db, "direct": pg.dsn(lg_db)})


@pytest.fixture(scope="module")
def browser():
    if MISSING:
        pytest.skip(f"!!! the console is NOT tested in a browser: {MISSING} !!!")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    os.environ.setdefault("SE_OFFLINE", "true")   # never let Selenium Manager download
    profile = tempfile.mkdtemp(prefix="rg-chromium-")
    opts = Options()
    opts.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(30)
    SHOTS.mkdir(parents=True, exist_ok=True)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def shot(driver, name: str) -> None:
    """The page as it is now, full height, under target/console-screenshots/."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1360, max(900, min(int(height) + 40, 4000)))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    driver.set_window_size(1360, 900)


def live_text(driver) -> str:
    from selenium.webdriver.common.by import By
    try:
        return driver.find_element(By.ID, "live").text
    except Exception:   # replaced under us by the poll
        return ""


def wait_until(driver, what, timeout: float, message: str):
    from selenium.webdriver.support.ui import WebDriverWait
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(what, message)


def park(dsn: str, thread: str, user: str = "bob") -> None:
    with PostgresSaver.from_conn_string(dsn) as saver:
        L.build_graph(saver).invoke(dict(L.INITIAL_INPUT),
                                    {"configurable": {"thread_id": thread, "user_id": user}})


def answer(dsn: str, thread: str, by: str) -> dict:
    with PostgresSaver.from_conn_string(dsn) as saver:
        return L.build_graph(saver).invoke(Command(resume={"approved": True, "by": by}),
                                           {"configurable": {"thread_id": thread}})


def raw(base: str, method: str, path: str, data: bytes | None = None,
        headers: dict | None = None) -> int:
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status
    except urllib.error.HTTPError as e:
        return e.code


# ----------------------------------------------------------------- without the token
def test_without_the_token_the_console_and_the_data_routes_answer_401(console):
    for path in ("/ui", "/ui/waiting", "/sessions", "/claims", "/threads/any", "/metrics"):
        assert raw(console.base, "GET", path) == 401, path
        assert http(console.base, "GET", path, token="wrong")[0] == 401, path
    # The release without the token: neither the API's nor the console's form.
    assert raw(console.base, "POST", "/claims/release", b'{"thread": "t"}',
               {"Content-Type": "application/json"}) == 401
    assert raw(console.base, "POST", "/ui/claims/release", b"thread=t&csrf=x",
               {"Content-Type": "application/x-www-form-urlencoded"}) == 401
    # The probes and the metrics listener answer anyone; the latter nothing else.
    assert raw(console.base, "GET", "/healthz") == 200
    status, text = http(console.metrics, "GET", "/metrics", token=None)
    assert status == 200 and "resumeguard_build_info" in text, text[:300]
    assert raw(console.metrics, "GET", "/sessions") == 404
    assert http(console.base, "GET", "/sessions")[0] == 200


# ----------------------------------------------------------------- in the browser
def test_the_console_follows_approvals_through_a_browser(console, browser):
    from selenium.webdriver.common.by import By
    d, base, dsn = browser, console.base, console.dsn
    d.get(f"{base}/ui/waiting")
    assert "Log in" in d.page_source
    shot(d, "login")
    d.find_element(By.ID, "token").send_keys(TOKEN)
    d.find_element(By.ID, "login").click()
    wait_until(d, lambda d: d.current_url.endswith("/ui/waiting"), 10, "no Waiting after login")
    cookie = d.get_cookie("rg_session")
    assert cookie and cookie["httpOnly"] and cookie.get("sameSite") == "Strict", cookie

    # Parked through the proxy: on the open Waiting page without a reload.
    thread = f"console-py-{uuid.uuid4().hex[:8]}"
    park(dsn, thread)
    parked_at = time.monotonic()
    wait_until(d, lambda d: thread in live_text(d), 10, f"{thread} never showed on Waiting")
    appeared_s = time.monotonic() - parked_at
    print(f"parked approval on Waiting after {appeared_s:.2f} s")
    assert appeared_s <= APPEAR_WITHIN_S, appeared_s
    row = live_text(d)
    assert "gate" in row and "approve?" in row, row      # node, and the question (log_values)
    shot(d, "waiting")

    # Answered through LangGraph: gone from Waiting, on Answered with its approver.
    assert answer(dsn, thread, "alice")["approved"]["by"] == "alice"
    wait_until(d, lambda d: thread not in live_text(d), 10, f"{thread} still on Waiting")
    d.get(f"{base}/ui/answered?thread={thread}")
    wait_until(d, lambda d: "alice" in live_text(d), 10, "no approver on Answered")
    assert thread in live_text(d) and "resume/by" in live_text(d), live_text(d)
    d.get(f"{base}/ui/answered")
    shot(d, "answered")

    # A racer refused: one reader holds the claim, another's resume is refused.
    raced = f"console-race-{uuid.uuid4().hex[:8]}"
    park(dsn, raced)
    cfg = {"configurable": {"thread_id": raced}}
    with PostgresSaver.from_conn_string(dsn) as holder:
        L.build_graph(holder).get_state(cfg)            # takes the claim, stays connected
        with pytest.raises(psycopg.Error):
            answer(dsn, raced, "mallory")
        # A late duplicate: the answered thread answered again.
        with pytest.raises(psycopg.Error):
            answer(dsn, thread, "eve")
        # A statement on the proxy's own schema: refused before it ran.
        with pytest.raises(psycopg.Error) as own:
            with psycopg.connect(dsn, autocommit=True) as c:
                c.execute("delete from resumeguard.claims")
        assert own.value.sqlstate == "42501", own.value
        d.get(f"{base}/ui/refused")
        wait_until(d, lambda d: raced in live_text(d) and "late duplicate" in live_text(d)
                   and "statement refused" in live_text(d), 10, "no refusals on Refused")
        assert "racer refused" in live_text(d), live_text(d)
        assert "belongs to resumeguard" in live_text(d), live_text(d)
        shot(d, "refused")

        # The parked task's write replayed by another client while the claim is held:
        # fenced (RGF01), on Writes fenced with the holder and its epoch.
        with psycopg.connect(console.direct, autocommit=True) as c:
            parked, task_id = c.execute(
                "select checkpoint_id, task_id from checkpoint_writes where thread_id = %s "
                "and channel = '__interrupt__'", (raced,)).fetchone()
        with pytest.raises(psycopg.Error) as fenced:
            with psycopg.connect(f"{dsn}&application_name=replayer", autocommit=True) as c:
                c.execute(PostgresSaver.UPSERT_CHECKPOINT_WRITES_SQL,
                          (raced, "", parked, task_id, "", 7, "replayed", "msgpack", b"\xa1x"))
        assert fenced.value.sqlstate == "RGF01", fenced.value
        d.get(f"{base}/ui/fenced")
        wait_until(d, lambda d: raced in live_text(d), 10, "no fenced write on Writes fenced")
        assert "replayer" in live_text(d), live_text(d)
        shot(d, "fenced")

        # The held claim, released from the console: confirmed, CSRF-checked.
        d.get(f"{base}/ui/claims?thread={raced}")
        assert raced in live_text(d) and "claimed" in live_text(d), live_text(d)
        shot(d, "claims")
        # A click returns before the page it loads is there: wait for it.
        d.find_element(By.LINK_TEXT, "Release…").click()
        wait_until(d, lambda d: "Release the claim of thread" in d.page_source, 10,
                   "no confirmation page")
        d.find_element(By.ID, "confirm-release").click()
        wait_until(d, lambda d: "Released 1 claim(s)" in d.page_source, 10,
                   "no release reported")
    # Released: the racer's answer now goes through.
    assert answer(dsn, raced, "mallory")["approved"]["by"] == "mallory"
    released = [e for e in console.proxy.audit(raced) if e["operation"] == "claim_released"]
    assert [e["detail"]["via"] for e in released] == ["console"], released

    # A fork served from the answered checkpoint.
    forked = f"console-fork-{uuid.uuid4().hex[:8]}"
    E.fork_scenario("conn", dsn, forked, "bare")
    d.get(f"{base}/ui/forks")
    wait_until(d, lambda d: forked in live_text(d), 10, "no fork on Forks served")
    shot(d, "forks")

    # A write refused by a channel rule: on Writes rejected with its rule and path.
    rejected = f"vt-console-{uuid.uuid4().hex[:8]}"   # the rule holds threads vt-*
    with E.Driver("conn", dsn) as drv:
        g = E.build_items_graph(drv.saver)
        drv.invoke(g, {"pending": "a"}, E.cfg_of(rejected))
        with pytest.raises(psycopg.errors.CheckViolation):
            drv.invoke(g, {"pending": None}, E.cfg_of(rejected))
    d.get(f"{base}/ui/rejected")
    wait_until(d, lambda d: rejected in live_text(d), 10, "no rejection on Writes rejected")
    assert "items" in live_text(d), live_text(d)
    shot(d, "rejected")

    # The thread's page: the timeline drawn, the chain verified.
    d.get(f"{base}/ui/answered?thread={thread}")
    d.find_element(By.LINK_TEXT, thread).click()
    wait_until(d, lambda d: d.find_elements(By.CSS_SELECTOR, "svg.timeline rect.parked"), 10,
               "no timeline drawn")
    assert d.find_elements(By.CSS_SELECTOR, "svg.timeline rect.running")
    assert d.find_elements(By.CSS_SELECTOR, "svg.timeline text.sym.refused"), \
        "the late duplicate is not marked"
    assert "the audit chain verifies" in d.find_element(By.ID, "chain").text
    shot(d, "thread")

    # A phone-sized window: the list reads as cards.
    d.get(f"{base}/ui/answered")
    d.set_window_size(390, 844)
    d.save_screenshot(str(SHOTS / "answered-phone.png"))
    d.set_window_size(1360, 900)


@pytest.mark.skipif(NODE is None, reason="!!! node is not installed: the console is NOT "
                    "tested with a LangGraph.js saver !!!")
def test_a_js_answer_shows_its_approver(console, browser, pg):
    from selenium.webdriver.common.by import By  # noqa: F401
    if not (JS_DIR / "node_modules").exists():
        pytest.skip("!!! integration/js/node_modules is missing (npm ci): the console is NOT "
                    "tested with a LangGraph.js saver !!!")

    def lg(*args: str) -> dict:
        cp = subprocess.run([NODE, str(JS_DIR / "lg.mjs"), *args], cwd=JS_DIR,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr[-3000:]
        return json.loads(cp.stdout.strip().splitlines()[-1])

    lg("setup", "--dsn", pg.dsn(console.db))
    thread = f"console-js-{uuid.uuid4().hex[:8]}"
    d = browser
    d.get(f"{console.base}/ui/waiting")
    lg("park", "--dsn", console.dsn, "--thread", thread)
    wait_until(d, lambda d: thread in live_text(d), 10, f"{thread} never showed on Waiting")
    done = lg("resume", "--dsn", console.dsn, "--thread", thread,
              "--value", json.dumps({"approved": True, "by": "dana"}))
    assert done["ok"], done
    d.get(f"{console.base}/ui/answered?approver=dana")
    wait_until(d, lambda d: thread in live_text(d), 10, "the JS answer is not on Answered")
    assert "dana" in live_text(d), live_text(d)


# ----------------------------------------------------------------- the PostgreSQL trail
def test_the_lists_read_the_postgresql_trail_of_every_replica(proxy_factory, workdir, lg_db):
    """With ``[audit] postgres = true`` the pages read the shared table."""
    port = free_port()
    cfg = workdir / "console-pg.toml"
    cfg.write_text(f'admin_listen = "{HOST}:{port}"\n\n[admin]\ntoken = "{TOKEN}"\n\n'
                   f'[audit]\npostgres = true\napprover_pointers = ["/by"]\n\n'
                   f'[claims]\nbackend = "postgres"\nproxy_id = "console-pg"\n')
    proxy = proxy_factory("--config", str(cfg), "--state-dir", str(workdir / "state-console-pg"),
                          name="console-pg")
    base = wait_admin(port)
    dsn = proxy.dsn(lg_db)
    thread = f"console-pgtrail-{uuid.uuid4().hex[:8]}"

    def page(path: str, want: str) -> str:
        deadline = time.monotonic() + 20
        while True:
            status, text = http(base, "GET", path)
            if (status == 200 and want in text) or time.monotonic() > deadline:
                return text
            time.sleep(0.2)

    park(dsn, thread)
    text = page(f"/ui/waiting?thread={thread}", thread)
    assert thread in text and "every replica" in text, text[-3000:]
    answer(dsn, thread, "alice")
    text = page(f"/ui/answered?thread={thread}", "alice")
    assert thread in text and "alice" in text, text[-3000:]
    assert "Nothing is waiting" in http(base, "GET", f"/ui/waiting?thread={thread}")[1]
    assert "alice" in http(base, "GET", "/ui/answered?approver=ALI")[1]


# ----------------------------------------------------------------- last: it blocks 127.0.0.1
def test_failed_logins_are_limited_and_logged(console):
    form = b"token=guess"
    hdr = {"Content-Type": "application/x-www-form-urlencoded"}
    codes = [raw(console.base, "POST", "/ui/login", form, hdr) for _ in range(6)]
    assert codes == [401] * 5 + [429], codes
    log = console.proxy.stderr_path.read_text(errors="replace")
    assert "console login refused" in log and "client=127.0.0.1" in log, log[-2000:]
