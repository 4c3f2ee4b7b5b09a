// Validates ServiceMonitors (a JSON list on stdin) with the validators of the npm package
// @kubernetes-models/prometheus-operator, generated from the Prometheus Operator's published API
// schema. Usage: node validate_servicemonitor.mjs NODE_PREFIX  (where that package is installed).
// Prints one line per object, "ok NAME" or "invalid NAME: REASON"; exits 1 if any is invalid.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const module = join(process.argv[2], "node_modules", "@kubernetes-models", "prometheus-operator",
  "monitoring.coreos.com", "v1", "ServiceMonitor.js");
const { ServiceMonitor } = await import(pathToFileURL(module).href);
let invalid = 0;
for (const doc of JSON.parse(readFileSync(0, "utf8"))) {
  try {
    new ServiceMonitor(doc).validate();
    console.log(`ok ${doc.metadata.name}`);
  } catch (error) {
    invalid++;
    console.log(`invalid ${doc.metadata.name}: ${error.message}`);
  }
}
process.exit(invalid ? 1 : 0);
