"""The Kubernetes sidecar example (deploy/kubernetes/resumeguard-sidecar.yaml)
read as data: the sidecar container, the ConfigMap file it mounts, and its
environment resolved against given secrets and pod fields, so the container
test runs the image with the manifest's own arguments and environment."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
MANIFEST = REPO / "deploy" / "kubernetes" / "resumeguard-sidecar.yaml"
SIDECAR = "resumeguard"


def documents(path: Path = MANIFEST) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def of_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def pod_spec(docs: list[dict]) -> dict:
    (deployment,) = of_kind(docs, "Deployment")
    return deployment["spec"]["template"]["spec"]


def sidecar(docs: list[dict]) -> dict:
    (c,) = [c for c in pod_spec(docs).get("initContainers", []) if c["name"] == SIDECAR]
    return c


def config_files(docs: list[dict]) -> dict[str, str]:
    """The files the sidecar's ConfigMap volumes put in the container, by path."""
    spec = pod_spec(docs)
    maps = {d["metadata"]["name"]: d["data"] for d in of_kind(docs, "ConfigMap")}
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    files = {}
    for m in sidecar(docs).get("volumeMounts", []):
        v = volumes[m["name"]]
        if "configMap" in v:
            for name, text in maps[v["configMap"]["name"]].items():
                files[f"{m['mountPath'].rstrip('/')}/{name}"] = text
    return files


def environment(docs: list[dict], secrets: dict[tuple[str, str], str],
                fields: dict[str, str]) -> dict[str, str]:
    """The sidecar's environment: literal values as they are, a secretKeyRef
    from ``secrets[(name, key)]``, a fieldRef from ``fields[fieldPath]``."""
    env = {}
    for e in sidecar(docs).get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
            continue
        ref = e["valueFrom"]
        if "secretKeyRef" in ref:
            s = ref["secretKeyRef"]
            env[e["name"]] = secrets[(s["name"], s["key"])]
        elif "fieldRef" in ref:
            env[e["name"]] = fields[ref["fieldRef"]["fieldPath"]]
        else:
            raise AssertionError(f"unsupported valueFrom in {e}")
    return env
