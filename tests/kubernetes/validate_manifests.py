"""Validate rendered Kubernetes manifests (multi-document YAML on stdin) against the
Kubernetes API's schemas, offline: built-in kinds with kubernetes-validate (the API's
OpenAPI schemas, shipped in the package, strict: unknown fields are errors) for every
version named in argv (default: the oldest and newest this deployment supports), custom
resources with validate-crds.mjs beside this file. Any object no schema covers is an
error, so nothing passes unchecked. Prints one line per problem; exit 1 if any.

tests/integration/test_kubernetes.py runs it in a network namespace of its own, so it is shown to
need no network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import kubernetes_validate
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
# the oldest Kubernetes the manifests are meant for (sidecar-free, runtimeClassName and
# PSA labels long GA) and the newest the validator knows
VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
CUSTOM_GROUPS = ("monitoring.coreos.com/",)


def problems(docs: list[dict], versions: tuple[str, ...] = VERSIONS) -> list[str]:
    out, custom = [], []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict) or not {"apiVersion", "kind"} <= doc.keys():
            out.append(f"document {i}: not a Kubernetes object (apiVersion and kind)")
            continue
        where = f"{doc['kind']}/{(doc.get('metadata') or {}).get('name')}"
        if doc["apiVersion"].startswith(CUSTOM_GROUPS):
            custom.append(doc)
            continue
        for version in versions:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = "/".join(str(p) for p in e.path)
                out.append(f"{where} (Kubernetes {version}): /{path}: {e.message}")
            except kubernetes_validate.SchemaNotFoundError as e:
                out.append(f"{where}: {e.message}")
    if custom:
        run = subprocess.run(["node", os.path.join(HERE, "validate-crds.mjs")], input=json.dumps(custom),
                             capture_output=True, text=True, cwd=HERE, timeout=60)
        results = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
        if len(results) != len(custom):
            out.append(f"validate-crds.mjs failed (exit {run.returncode}): {run.stderr.strip()[-2000:]}")
        for r in results:
            if r["errors"] is None:
                out.append(f"{r['kind']}/{r['name']}: no schema for this custom resource")
            else:
                out += [f"{r['kind']}/{r['name']}: {e}" for e in r["errors"]]
    return out


def main() -> int:
    try:
        docs = [d for d in yaml.safe_load_all(sys.stdin) if d is not None]
    except yaml.YAMLError as e:
        print(f"stdin: not YAML: {e}")
        return 1
    found = problems(docs, tuple(sys.argv[1:]) or VERSIONS)
    for p in found:
        print(p)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
