"""The deployment examples hold together: the Kubernetes sidecar manifest
parses, is a native sidecar with the probes and grace period the proxy needs,
takes its configuration from a ConfigMap and its credentials from a Secret
through the environment, and names only configuration variables the binary
knows (``config check`` accepts its environment and file); the systemd unit
verifies. The container test (test_container.py) runs the image with this
manifest's arguments and environment."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib

import pytest

import k8s_manifest as K
from conftest import REPO, proxy_binary

SECRETS = {("resumeguard-credentials", "upstream"): "postgres://rg:pw@db.example:5432/app",
           ("resumeguard-credentials", "admin-token"): "t0ken"}
FIELDS = {"metadata.name": "agent-7d9f-x2"}


def test_the_manifest_is_a_native_sidecar_with_probes_and_grace():
    docs = K.documents()
    assert {d["kind"] for d in docs} == {"ConfigMap", "Deployment"}
    spec = K.pod_spec(docs)
    c = K.sidecar(docs)
    assert c["restartPolicy"] == "Always", "a native sidecar"
    assert c["args"] == ["serve"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    env = K.environment(docs, SECRETS, FIELDS)
    assert env["RESUMEGUARD_ADMIN_LISTEN"].endswith(f":{ports['admin']}")
    assert env["RESUMEGUARD_LISTEN"] == f"127.0.0.1:{ports['postgres']}"
    # Configuration from the ConfigMap's file, credentials from the Secret.
    files = K.config_files(docs)
    assert list(files) == [env["RESUMEGUARD_CONFIG"]]
    cfg = tomllib.loads(files[env["RESUMEGUARD_CONFIG"]])
    by_name = {e["name"]: e for e in c["env"]}
    for var in ("RESUMEGUARD_UPSTREAM", "RESUMEGUARD_ADMIN_TOKEN"):
        assert "secretKeyRef" in by_name[var]["valueFrom"], var
    # The pod waits for in-flight work to finish before it is killed.
    grace_ms = cfg.get("shutdown_grace_ms", 10_000)
    assert spec["terminationGracePeriodSeconds"] * 1000 > grace_ms
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["securityContext"]["runAsNonRoot"] is True


def test_config_check_accepts_the_manifest_configuration(tmp_path):
    docs = K.documents()
    env = K.environment(docs, SECRETS, FIELDS)
    ((path, text),) = K.config_files(docs).items()
    local = tmp_path / "resumeguard.toml"
    local.write_text(text)
    env["RESUMEGUARD_CONFIG"] = str(local)
    env["RESUMEGUARD_MANAGED_ENABLED"] = "false"   # as the image sets it
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RESUMEGUARD_")}
    cp = subprocess.run([str(proxy_binary()), "config", "check"], env={**clean, **env},
                        capture_output=True, text=True, timeout=30)
    assert cp.returncode == 0, cp.stderr
    assert "no configuration key" not in cp.stderr, cp.stderr
    shown = subprocess.run([str(proxy_binary()), "config", "show"], env={**clean, **env},
                           capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert 'proxy_id = "agent-7d9f-x2"  # env RESUMEGUARD_CLAIMS_PROXY_ID' in shown.stdout
    assert "t0ken" not in shown.stdout and ":pw@" not in shown.stdout, shown.stdout


def test_the_systemd_unit_verifies(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed: the unit is not verified")
    unit = (REPO / "deploy" / "systemd" / "resumeguard.service").read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit
    local = tmp_path / "resumeguard.service"
    local.write_text(unit.replace("/usr/local/bin/resumeguard", str(proxy_binary())))
    cp = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True,
                        timeout=60)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    problems = [line for line in (cp.stdout + cp.stderr).splitlines() if "resumeguard.service" in line]
    assert not problems, problems
