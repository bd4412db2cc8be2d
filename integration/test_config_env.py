"""Configuration by environment: every key as ``RESUMEGUARD_<SECTION>_<KEY>``,
one precedence (flag > environment > file > default), secrets from files.

* ``serve`` configured by the environment alone (no flag, no file) serves a
  LangGraph park / resume, its audit events carry the proxy id the
  environment gave, and the admin token comes from ``RESUMEGUARD_ADMIN_TOKEN_FILE``.
* A wrong value in the environment stops ``serve`` and fails ``config check``
  (exit 1) naming the variable; a typo'd variable is warned of.
* ``config show`` prints the configuration in effect as TOML with each
  value's source, the token redacted; ``config check`` exits 0 on a good
  configuration and 1 with the reason on one that cannot run (a rules
  directory that does not load, no upstream with the managed server off).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import tomllib
import urllib.request
import uuid

import pytest

import lg_scenarios
from conftest import HOST, free_port, port_accepts, proxy_binary, run_audit_cli

CLEAN = {k: v for k, v in os.environ.items() if not k.startswith("RESUMEGUARD_")}


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 30):
    return subprocess.run([str(proxy_binary()), *args], env={**CLEAN, **(env or {})},
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module", autouse=True)
def migrated(direct_dsn):
    lg_scenarios.setup_db("conn", direct_dsn)


def test_serve_configured_by_the_environment_alone(pg, dbname, workdir):
    port, admin = free_port(), free_port()
    state = workdir / f"env-state-{uuid.uuid4().hex[:6]}"
    token_file = workdir / f"env-token-{uuid.uuid4().hex[:6]}"
    token_file.write_text("from-a-file\n")
    env = {**CLEAN, "RUST_LOG": "info",
           "RESUMEGUARD_LISTEN": f"{HOST}:{port}",
           "RESUMEGUARD_UPSTREAM": f"postgres://postgres@{HOST}:{pg.port}/{dbname}",
           "RESUMEGUARD_ADMIN_LISTEN": f"{HOST}:{admin}",
           "RESUMEGUARD_STATE_DIR": str(state),
           "RESUMEGUARD_CLAIMS_PROXY_ID": "from-env",
           "RESUMEGUARD_CLAIMS_LAPSE_MS": "2500",
           "RESUMEGUARD_ADMIN_TOKEN_FILE": str(token_file),
           "RESUMEGUARD_CLAIMS_LAPSE": "typo"}
    stderr = open(workdir / "env-serve.stderr", "wb")
    proc = subprocess.Popen([str(proxy_binary()), "serve"], env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        deadline = time.monotonic() + 30
        while not (port_accepts(port) and port_accepts(admin)):
            assert proc.poll() is None and time.monotonic() < deadline, \
                (workdir / "env-serve.stderr").read_text()
            time.sleep(0.05)
        dsn = f"postgresql://postgres@{HOST}:{port}/{dbname}?connect_timeout=10"
        thread = f"env-{uuid.uuid4().hex[:8]}"
        assert lg_scenarios.park("conn", dsn, thread)["state"]["next"] == ["gate"]
        assert lg_scenarios.resume("conn", dsn, thread, True)["result"]["approved"] is True
        # The token is the file's: POST /reload takes it, not another.
        def reload(token: str) -> int:
            req = urllib.request.Request(f"http://{HOST}:{admin}/reload", method="POST",
                                         headers={"Authorization": f"Bearer {token}"})
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    return r.status
            except urllib.error.HTTPError as e:
                return e.code
        assert reload("wrong") == 401
        assert reload("from-a-file") == 200
        req = urllib.request.Request(f"http://{HOST}:{admin}/config",
                                     headers={"Authorization": "Bearer from-a-file"})
        with urllib.request.urlopen(req, timeout=5) as r:
            shown = r.read().decode()
        assert "lapse_ms = 2500  # env RESUMEGUARD_CLAIMS_LAPSE_MS" in shown, shown
        assert "from-a-file" not in shown, shown
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        stderr.close()
    log = (workdir / "env-serve.stderr").read_text()
    assert rc == 0, log
    assert "RESUMEGUARD_CLAIMS_LAPSE" in log and "no configuration key" in log, log
    deadline = time.monotonic() + 10
    while not (events := run_audit_cli(state / "audit.sqlite", thread)):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert {e["proxy_id"] for e in events} == {"from-env"}, events


@pytest.mark.parametrize("var,value", [("RESUMEGUARD_CLAIMS_LAPSE_MS", "soon"),
                                       ("RESUMEGUARD_ENFORCE_VALIDITY", "maybe"),
                                       ("RESUMEGUARD_MAX_CLIENT_CONN", "-3")])
def test_a_wrong_value_in_the_environment_names_its_variable(var, value, pg):
    env = {var: value, "RESUMEGUARD_UPSTREAM": f"{HOST}:{pg.port}",
           "RESUMEGUARD_ADMIN_LISTEN": "off", "RESUMEGUARD_LISTEN": f"{HOST}:{free_port()}"}
    for args in (["config", "check"], ["serve"]):
        cp = cli(*args, env=env)
        assert cp.returncode == 1, (args, cp.stdout, cp.stderr)
        assert f"environment variable {var}=" in cp.stderr, cp.stderr
        assert value in cp.stderr, cp.stderr


RETIRED = ("the SQLite claims backend was retired: claims live in PostgreSQL (the database "
           "the proxy fronts by default, or [claims] dsn); remove claims.")


@pytest.mark.parametrize("how", ["file-backend", "file-store", "env-backend", "env-store",
                                 "flag-store", "claims-list-store", "claims-release-store"])
def test_a_configuration_naming_the_retired_sqlite_claims_backend_is_refused(how, tmp_path, pg):
    """``[claims] backend = "sqlite"`` or ``[claims] store``, however given, stops
    ``config check``, ``serve`` and the claims commands with exit 1 and one line saying
    the backend was retired, where the claims live now and which key to remove."""
    conf = tmp_path / "rg.toml"
    conf.write_text(f"upstream = '{HOST}:{pg.port}'\nadmin_listen = 'off'\n"
                    f"listen = '{HOST}:{free_port()}'\n")
    env: dict[str, str] = {"RESUMEGUARD_CONFIG": str(conf)}
    flags: list[str] = []
    key = "store = /old/claims.sqlite"
    if how == "file-backend":
        conf.write_text(conf.read_text() + "[claims]\nbackend = 'sqlite'\n")
        key = 'backend = "sqlite"'
    elif how == "file-store":
        conf.write_text(conf.read_text() + "[claims]\nstore = '/old/claims.sqlite'\n")
    elif how == "env-backend":
        env["RESUMEGUARD_CLAIMS_BACKEND"] = "sqlite"
        key = 'backend = "sqlite"'
    elif how == "env-store":
        env["RESUMEGUARD_CLAIMS_STORE"] = "/old/claims.sqlite"
    elif how == "flag-store":
        flags = ["--claims-store", "/old/claims.sqlite"]
    if how.startswith("claims-"):
        sub = how.split("-")[1]
        runs = [["claims", sub, *(["--thread", "t"] if sub == "release" else []),
                 "--store", "/old/claims.sqlite", "--upstream", f"{HOST}:{pg.port}"]]
    else:
        runs = [["config", "check", *flags], ["serve", *flags]]
    for args in runs:
        cp = cli(*args, env=env)
        assert cp.returncode == 1, (args, cp.stdout, cp.stderr)
        lines = cp.stderr.strip().splitlines()
        assert len(lines) == 1, (args, cp.stderr)
        assert RETIRED + key in lines[0], (args, lines[0])


def test_config_show_names_where_each_value_came_from(tmp_path):
    conf = tmp_path / "rg.toml"
    conf.write_text("listen = '127.0.0.1:7000'\nupstream = 'db:5432'\n"
                    "[claims]\nlapse_ms = 100\npoll_ms = 7\n[admin]\ntoken = 's3cret-in-file'\n")
    cp = cli("config", "show", "--listen", "127.0.0.1:7002",
             env={"RESUMEGUARD_CONFIG": str(conf), "RESUMEGUARD_CLAIMS_LAPSE_MS": "250",
                  "RESUMEGUARD_LISTEN": "127.0.0.1:7001",
                  "RESUMEGUARD_CLAIMS_DSN": "postgres://rg:pw-in-env@db/app"})
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    for line in ['listen = "127.0.0.1:7002"  # flag --listen',
                 f'upstream = "db:5432"  # file {conf}',
                 "lapse_ms = 250  # env RESUMEGUARD_CLAIMS_LAPSE_MS",
                 f"poll_ms = 7  # file {conf}",
                 "holder_gone_grace_ms = 1000  # default",
                 f'token = "(redacted)"  # file {conf}']:
        assert line in out.splitlines(), f"{line!r} not in\n{out}"
    assert "s3cret-in-file" not in out and "pw-in-env" not in out, out
    parsed = tomllib.loads(out)
    assert parsed["claims"]["lapse_ms"] == 250 and parsed["listen"] == "127.0.0.1:7002"


def test_config_check_says_whether_serve_could_start(tmp_path, pg):
    good = tmp_path / "good.toml"
    good.write_text(f"upstream = '{HOST}:{pg.port}'\n[claims]\nlapse_ms = 500\n")
    cp = cli("config", "check", "--config", str(good))
    assert cp.returncode == 0, cp.stderr
    assert "configuration ok" in cp.stdout, cp.stdout

    rules = tmp_path / "rules"
    (rules / "channels").mkdir(parents=True)
    (rules / "channels" / "broken.toml").write_text("[[channel]\nname = ")
    cp = cli("config", "check", "--config", str(good), "--rules", str(rules))
    assert cp.returncode == 1 and "broken.toml" in cp.stderr, cp.stderr

    cp = cli("config", "check", env={"RESUMEGUARD_MANAGED_ENABLED": "false"})
    assert cp.returncode == 1 and "no upstream is configured" in cp.stderr, cp.stderr
    cp = cli("config", "check", "--config", str(tmp_path / "missing.toml"))
    assert cp.returncode == 1 and "missing.toml" in cp.stderr, cp.stderr
