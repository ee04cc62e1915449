// Validates the custom resources among Kubernetes objects against their CRDs' schemas,
// offline: kubernetes-models ships validators generated from prometheus-operator's API
// types. Reads a JSON array of objects on stdin; prints one JSON line per object,
// {"kind", "name", "errors": [...]} (kinds it has no schema for: errors null); exits 1
// when any object is invalid. tests/test_kubernetes.py runs it.
import { readFileSync } from "node:fs";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";

const MODELS = { "monitoring.coreos.com/v1/ServiceMonitor": ServiceMonitor };

let invalid = false;
for (const obj of JSON.parse(readFileSync(0, "utf8"))) {
  const Model = MODELS[`${obj.apiVersion}/${obj.kind}`];
  let errors = null;
  if (Model) {
    try {
      new Model(obj).validate();
      errors = [];
    } catch (e) {
      errors = (e.errors || [e]).map((x) => `${x.instancePath || "/"}: ${x.message}`);
      invalid = true;
    }
  }
  console.log(JSON.stringify({ kind: obj.kind, name: obj.metadata?.name, errors }));
}
process.exit(invalid ? 1 : 0);
