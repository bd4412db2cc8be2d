"""The container image: built with podman from the repository's Dockerfile,
its runtime stage around the release binary already built (``--target
prebuilt``), on a base made here from Debian packages (no image registry:
mmdebstrap makes a bookworm rootfs, cached under target/container/, which
``podman import`` turns into the base image). The container runs with the
Kubernetes sidecar example's arguments and environment (k8s_manifest.py:
its ConfigMap file mounted where the manifest mounts it, its Secret and pod
fields filled in; only the two listen ports differ, the container shares the
host's network), read-only root, as the image's non-root user:

* a LangGraph park / resume through the containerized proxy;
* a consume-once race of N=4 racer processes fires once, the others refused;
* without an upstream, ``serve`` in the image refuses to start (no managed
  PostgreSQL there);
* the image has no compiler and runs as uid 10001; SIGTERM ends it with 0.

Skipped (with the reason) only when podman cannot run containers here; the
CI entry point (.ci/run) installs podman, runc and mmdebstrap.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

import k8s_manifest as K
import lg_scenarios
import racer as R
from conftest import HOST, REPO, free_port, proxy_binary
from test_consume_once import IN_USE, REFUSED, Racers, ledger, make_jobs

HERE = Path(__file__).resolve().parent
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
if not TARGET.is_absolute():
    TARGET = REPO / TARGET
CACHE = TARGET / "container"
ROOTFS = CACHE / "bookworm-rootfs.tar"
BASE = "localhost/resumeguard-base:bookworm"
IMAGE = "localhost/resumeguard:integration"
MIRROR = os.environ.get("RG_DEBIAN_MIRROR", "http://deb.debian.org/debian")
UID = 10001

# The first run makes the rootfs (about a minute, more on a busy machine) and
# the base image; later runs reuse both from target/container.
pytestmark = pytest.mark.timeout(600)


def podman_env(driver: str) -> dict[str, str]:
    """podman with its own configuration and storage under target/container:
    no default ulimits, runc, cgroupfs, the storage `driver`."""
    CACHE.mkdir(parents=True, exist_ok=True)
    conf = CACHE / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = []\n\n'
                    '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\n'
                    'events_logger = "file"\n')
    storage = CACHE / f"storage-{driver}.conf"
    storage.write_text(f'[storage]\ndriver = "{driver}"\nrunroot = "{CACHE / f"run-{driver}"}"\n'
                       f'graphroot = "{CACHE / f"storage-{driver}"}"\n')
    return {**os.environ, "CONTAINERS_CONF": str(conf), "CONTAINERS_STORAGE_CONF": str(storage)}


class Podman:
    def __init__(self, binary: str, driver: str):
        self.binary = binary
        self.driver = driver
        self.env = podman_env(driver)

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        cp = subprocess.run([self.binary, *args], env=self.env, capture_output=True, text=True,
                            timeout=timeout, stdin=subprocess.DEVNULL)
        if check and cp.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {cp.returncode}:\n"
                                 f"{cp.stdout[-3000:]}\n{cp.stderr[-3000:]}")
        return cp


def base_rootfs() -> None:
    """A minimal Debian bookworm rootfs with ca-certificates, made once."""
    if ROOTFS.exists():
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    mmdebstrap = shutil.which("mmdebstrap")
    assert mmdebstrap, "mmdebstrap is not installed (.ci/run installs it) and no cached rootfs"
    part = ROOTFS.with_suffix(".part.tar")
    cp = subprocess.run([mmdebstrap, "--variant=essential", "--include=ca-certificates",
                         *(f"--dpkgopt=path-exclude=/usr/share/{d}/*"
                           for d in ("doc", "man", "locale", "info")),
                         "bookworm", str(part), MIRROR],
                        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert cp.returncode == 0, f"mmdebstrap failed:\n{cp.stderr[-3000:]}"
    part.rename(ROOTFS)


def with_base(p: Podman) -> subprocess.CompletedProcess:
    """The base image in `p`'s storage (imported once), and a container of it run."""
    if p.run("image", "exists", BASE, check=False).returncode != 0:
        imported = p.run("import", str(ROOTFS), BASE, check=False)
        if imported.returncode != 0:
            return imported
    return p.run("run", "--rm", "--network", "host", BASE, "/bin/true", check=False, timeout=120)


@pytest.fixture(scope="module")
def podman() -> Podman:
    """podman on overlay storage where it works here (a build in seconds),
    else on vfs (copies every layer: slower, works everywhere)."""
    binary = shutil.which("podman")
    if binary is None:
        pytest.skip("SKIPPED LOUDLY: podman is not installed; the container image is not tested")
    base_rootfs()
    failures = []
    for driver in ("overlay", "vfs"):
        p = Podman(binary, driver)
        info = p.run("info", check=False, timeout=60)
        ran = with_base(p) if info.returncode == 0 else info
        if ran.returncode == 0:
            return p
        failures.append(f"{driver}: {(ran.stderr or ran.stdout)[-600:]}")
    pytest.skip("SKIPPED LOUDLY: podman cannot run containers here: " + " | ".join(failures))


@pytest.fixture(scope="module")
def image(podman, tmp_path_factory) -> str:
    started = time.monotonic()
    ctx = tmp_path_factory.mktemp("image-context")
    shutil.copy2(proxy_binary(), ctx / "resumeguard")
    podman.run("build", "--network", "host", "--target", "prebuilt",
               "--build-arg", f"RUNTIME_BASE={BASE}", "--build-arg", "BINARY=resumeguard",
               "-t", IMAGE, "-f", str(REPO / "Dockerfile"), str(ctx))
    print(f"container image {IMAGE} built in {time.monotonic() - started:.1f} s "
          f"({podman.driver} storage)")
    return IMAGE


class Container:
    def __init__(self, podman: Podman, name: str, port: int, admin_port: int, token: str):
        self.podman, self.name, self.port, self.admin_port, self.token = (
            podman, name, port, admin_port, token)

    def logs(self, tail: int | None = 6000) -> str:
        """The container's output: its last `tail` characters (None: all)."""
        cp = self.podman.run("logs", self.name, check=False)
        out = cp.stdout + cp.stderr
        return out if tail is None else out[-tail:]

    def dsn(self, dbname: str) -> str:
        return f"postgresql://postgres@{HOST}:{self.port}/{dbname}?connect_timeout=10"

    def pid(self) -> int:
        return int(self.podman.run("inspect", "-f", "{{.State.Pid}}", self.name).stdout.strip())


def manifest_run(podman: Podman, image: str, pg, dbname: str, tmp: Path) -> tuple[Container, list[str]]:
    """`podman run` of the image as the manifest's sidecar: its args, its
    environment (Secret and pod fields filled in; the listen ports free ones
    on the host's network), its ConfigMap file mounted where it mounts it."""
    docs = K.documents()
    sidecar = K.sidecar(docs)
    token = secrets.token_hex(12)
    name = f"rg-it-{uuid.uuid4().hex[:8]}"
    env = K.environment(
        docs,
        {("resumeguard-credentials", "upstream"): f"postgres://postgres@{HOST}:{pg.port}/{dbname}",
         ("resumeguard-credentials", "admin-token"): token},
        {"metadata.name": name})
    port, admin_port = free_port(), free_port()
    assert env["RESUMEGUARD_LISTEN"].startswith("127.0.0.1:")
    env["RESUMEGUARD_LISTEN"] = f"{HOST}:{port}"
    env["RESUMEGUARD_ADMIN_LISTEN"] = f"{HOST}:{admin_port}"
    argv = ["run", "-d", "--name", name, "--network", "host", "--read-only"]
    for path, text in K.config_files(docs).items():
        local = tmp / "config" / Path(path).name
        local.parent.mkdir(parents=True, exist_ok=True)
        local.parent.chmod(0o755)
        local.write_text(text)
        local.chmod(0o644)
        argv += ["-v", f"{local.parent}:{Path(path).parent}:ro"]
    for k, v in env.items():
        argv += ["-e", f"{k}={v}"]
    argv += [image, *sidecar["args"]]
    podman.run(*argv)
    return Container(podman, name, port, admin_port, token), sorted(env)


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def container(podman, image, pg, dbname, direct_dsn, tmp_path_factory):
    lg_scenarios.setup_db("conn", direct_dsn)
    out = subprocess.run([sys.executable, str(HERE / "racer.py"), "setup", "--dsn", direct_dsn],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    c, env_names = manifest_run(podman, image, pg, dbname, tmp_path_factory.mktemp("container"))
    c.env_names = env_names
    deadline = time.monotonic() + 30
    while http_status(f"http://{HOST}:{c.admin_port}/readyz") != 200:
        state = podman.run("inspect", "-f", "{{.State.Status}}", c.name, check=False).stdout.strip()
        assert state == "running" and time.monotonic() < deadline, \
            f"container {state}, not ready\n{c.logs()}"
        time.sleep(0.2)
    yield c
    podman.run("stop", "-t", "20", c.name, check=False, timeout=60)
    code = podman.run("inspect", "-f", "{{.State.ExitCode}}", c.name, check=False).stdout.strip()
    logs = c.logs()
    podman.run("rm", "-f", c.name, check=False)
    assert code == "0", f"exit code {code} after SIGTERM\n{logs}"


def test_the_container_runs_as_the_manifest_says(container):
    docs = K.documents()
    assert container.env_names == sorted(e["name"] for e in K.sidecar(docs)["env"])
    status = Path(f"/proc/{container.pid()}/status").read_text()
    uid = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert uid == [str(UID)] * 4, status
    req = urllib.request.Request(f"http://{HOST}:{container.admin_port}/config",
                                 headers={"Authorization": f"Bearer {container.token}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        shown = r.read().decode()
    assert f'proxy_id = "{container.name}"  # env RESUMEGUARD_CLAIMS_PROXY_ID' in shown, shown
    assert container.token not in shown
    assert 'jsonl = "-"  # file /etc/resumeguard/resumeguard.toml' in shown, shown


def test_the_containers_loops_wait_on_epoll_where_its_seccomp_forbids_io_uring(container):
    """Podman's default seccomp profile forbids io_uring: the proxy says so at
    start, as a WARN, and its event loops wait on epoll (the LangGraph and
    race tests of this module relay through them)."""
    logs = container.logs(tail=None)
    lines = logs.splitlines()
    refused = [line for line in lines if "the kernel refuses io_uring" in line]
    assert len(refused) == 1 and " WARN " in refused[0] and \
        "the event loops wait on epoll" in refused[0], logs[-3000:]
    started = [line for line in lines if "relay event loops started" in line]
    assert len(started) == 1 and 'io="epoll"' in started[0], logs[-3000:]


def test_langgraph_parks_and_resumes_through_the_container(container, dbname):
    dsn = container.dsn(dbname)
    thread = f"ct-{uuid.uuid4().hex[:8]}"
    parked = lg_scenarios.park("conn", dsn, thread)
    assert parked["state"]["next"] == ["gate"], parked
    done = lg_scenarios.resume("conn", dsn, thread, True)
    assert done["result"]["approved"] is True, done
    # The audit trail on stdout (the ConfigMap's jsonl = "-") has the thread.
    deadline = time.monotonic() + 10
    while thread not in container.logs():
        assert time.monotonic() < deadline, container.logs()
        time.sleep(0.2)


class RaceEnv:
    """What the racers of test_consume_once need: a work directory and the
    direct DSN of their ledger."""

    def __init__(self, direct: str, workdir: Path):
        self.direct, self.workdir = direct, workdir


def test_a_race_of_four_fires_once_through_the_container(container, dbname, direct_dsn,
                                                         tmp_path):
    dsn = container.dsn(dbname)
    env = RaceEnv(direct_dsn, tmp_path)
    R.CTX["ledger_dsn"] = direct_dsn
    R.CTX["ledger"] = None
    jobs = make_jobs(dsn, "bare", (300,), 1, "conn", "ct")
    racers = Racers(env, [dsn] * 4, "conn", jobs, "c")
    try:
        (results,) = racers.run_all()
    finally:
        racers.kill()
    rows = ledger(env, jobs[0]["thread"])
    ctx = json.dumps({"results": results, "ledger": rows}, indent=1, default=str)
    assert len(rows) == 1, f"expected one fire\n{ctx}"
    winner = rows[0][0]
    for r in results:
        if r["id"] == winner:
            assert r["ok"] and r["values"]["approved"] == f"v-{winner}", ctx
        elif not r["ok"]:
            assert r["error"]["sqlstate"] in (REFUSED, IN_USE), ctx
        else:
            # A late racer read the head once the winner had moved it on: no
            # node of its own ran (the ledger has one row), the winner's values.
            assert r["values"]["approved"] == f"v-{winner}", ctx
    assert sum(not r["ok"] for r in results) >= 1, ctx


def test_the_image_needs_an_upstream_and_has_no_compiler(podman, image):
    cp = podman.run("run", "--rm", "--network", "host", "-e", "RESUMEGUARD_ADMIN_LISTEN=off",
                    image, "serve", check=False, timeout=60)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    assert "no upstream is configured" in cp.stderr, cp.stderr
    cp = podman.run("run", "--rm", "--entrypoint", "/bin/sh", image, "-c",
                    "for c in cc gcc clang rustc cargo; do command -v $c; done; id -u",
                    check=False, timeout=60)
    assert cp.stdout.split() == [str(UID)], cp.stdout + cp.stderr
