"""Validate rendered Kubernetes manifests (multi-document YAML on stdin) against the
Kubernetes API's schemas, offline: built-in kinds with kubernetes-validate (the API's
OpenAPI schemas, shipped in the package, strict: unknown fields are errors) for every
version named in argv (default: the oldest and newest this deployment supports), custom
resources with validate-crds.mjs beside this file. Any object no schema covers is an
error, so nothing passes unchecked. Prints one line per problem; exit 1 if any. With
``--each`` first: several sets at once (a JSON object naming each list of objects), their
problems as a JSON object of the same names, from one process (and one run of
validate-crds.mjs) for all of them.

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
    return problems_of_each([docs], versions)[0]


def problems_of_each(sets: list[list[dict]], versions: tuple[str, ...] = VERSIONS) -> list[list[str]]:
    """``problems`` of each set of documents: the built-in kinds' first, in order, then the
    custom resources', all sets' custom resources checked by one run of validate-crds.mjs."""
    found, custom = [], []
    for docs in sets:
        out, mine = [], []
        for i, doc in enumerate(docs):
            if not isinstance(doc, dict) or not {"apiVersion", "kind"} <= doc.keys():
                out.append(f"document {i}: not a Kubernetes object (apiVersion and kind)")
                continue
            where = f"{doc['kind']}/{(doc.get('metadata') or {}).get('name')}"
            if doc["apiVersion"].startswith(CUSTOM_GROUPS):
                mine.append(doc)
                continue
            for version in versions:
                try:
                    kubernetes_validate.validate(doc, version, strict=True)
                except kubernetes_validate.ValidationError as e:
                    path = "/".join(str(p) for p in e.path)
                    out.append(f"{where} (Kubernetes {version}): /{path}: {e.message}")
                except kubernetes_validate.SchemaNotFoundError as e:
                    out.append(f"{where}: {e.message}")
        found.append(out)
        custom.append(mine)
    everything = [doc for mine in custom for doc in mine]
    if everything:
        run = subprocess.run(["node", os.path.join(HERE, "validate-crds.mjs")], input=json.dumps(everything),
                             capture_output=True, text=True, cwd=HERE, timeout=60)
        results = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
        failed = len(results) != len(everything)
        for out, mine in zip(found, custom):
            if not mine:
                continue
            if failed:
                out.append(f"validate-crds.mjs failed (exit {run.returncode}): {run.stderr.strip()[-2000:]}")
                continue
            for r in results[:len(mine)]:
                if r["errors"] is None:
                    out.append(f"{r['kind']}/{r['name']}: no schema for this custom resource")
                else:
                    out += [f"{r['kind']}/{r['name']}: {e}" for e in r["errors"]]
            results = results[len(mine):]
    return found


def main() -> int:
    if sys.argv[1:2] == ["--each"]:
        # several sets at once (a JSON object of named lists of objects on stdin): a JSON object
        # of their problems on stdout; exit 0 (what each set's own run would have said is in it)
        sets = json.load(sys.stdin)
        json.dump(dict(zip(sets, problems_of_each(list(sets.values()), tuple(sys.argv[2:]) or VERSIONS))),
                  sys.stdout)
        return 0
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
