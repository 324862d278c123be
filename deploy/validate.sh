#!/usr/bin/env bash
# deploy/validate.sh (make validate-deploy): validates the deployment files.
#
#   yamllint      (Debian package) every YAML file under deploy/
#   kustomize     `kubectl kustomize` renders the base and the models-pvc
#                 component (skipped, with a note, when kubectl is absent)
#   Kubernetes    every rendered object against the Kubernetes OpenAPI
#                 schemas compiled into the npm package kubernetes-models
#                 (types, required fields, enums, int-or-string, quantities)
#   Compose       docker-compose.yml against the Compose Specification JSON
#                 schema (the copy shipped in the npm package dclint), with
#                 merge keys resolved and ${VAR:-default} interpolated first,
#                 then dclint's own rules
#   consistency   what no schema knows: Service/PDB selectors match the pod
#                 labels, HPA target, every serve flag of server/config.c is
#                 in the ConfigMap, the compose file and the Dockerfile, grace
#                 period >= preStop + drain, workers x threads <= CPU limit,
#                 non-root / read-only / no capabilities, probes, nginx
#                 upstreams and Prometheus targets = the compose replicas
#   nginx -t      (Debian package nginx) the gateway config, upstream hosts
#                 mapped to loopback
#
# Tools are installed on first use: apt packages (as root) and npm packages
# into build/validate-tools/ (never into the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
tools=${VALIDATE_TOOLS_DIR:-$src/build/validate-tools}
out=$src/build/validate
mkdir -p "$tools" "$out"
fails=0
pass() { printf '  ok    %s\n' "$*"; }
bad() { printf '  FAIL  %s\n' "$*"; fails=$((fails + 1)); }

# ------------------------------------------------------------------ tools
need=""
command -v yamllint >/dev/null || need="$need yamllint"
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need="$need nginx-light"
command -v node >/dev/null || need="$need nodejs"
command -v npm >/dev/null || need="$need npm"
if [ -n "$need" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "validate-deploy needs:$need; run: sudo apt-get install -y$need" >&2
    exit 1
  fi
  echo "installing:$need"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  # no service start from the nginx package's postinst
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  # shellcheck disable=SC2086
  apt-get install -y -q --no-install-recommends $need >/dev/null || { rm -f /usr/sbin/policy-rc.d; exit 1; }
  rm -f /usr/sbin/policy-rc.d
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
npm_pkgs="kubernetes-models@5.1.0 dclint@3.1.0 ajv@8 ajv-formats@3 yaml@2"
if [ ! -f "$tools/.installed" ] || [ "$(cat "$tools/.installed")" != "$npm_pkgs" ]; then
  echo "npm install (into $tools): $npm_pkgs"
  [ -f "$tools/package.json" ] || echo '{"private": true}' >"$tools/package.json"
  # shellcheck disable=SC2086
  (cd "$tools" && npm install --no-audit --no-fund --silent $npm_pkgs 2>&1 | grep -v 'Unknown user config' || true)
  [ -d "$tools/node_modules/kubernetes-models" ] && [ -d "$tools/node_modules/dclint" ] || { echo "npm install failed" >&2; exit 1; }
  echo "$npm_pkgs" >"$tools/.installed"
fi

# --------------------------------------------------------------- yamllint
echo "yamllint"
cat >"$out/yamllint.yml" <<'EOF'
extends: default
rules:
  line-length: {max: 130}
  document-start: disable
  comments: {min-spaces-from-content: 1}
  truthy: {check-keys: false}
  braces: {max-spaces-inside: 1}
  brackets: {max-spaces-inside: 1}
EOF
if yamllint -f parsable -c "$out/yamllint.yml" deploy/; then pass "yamllint deploy/"; else bad "yamllint deploy/"; fi

# -------------------------------------------------------------- kustomize
echo "kustomize"
rendered=()
if command -v kubectl >/dev/null; then
  if kubectl kustomize deploy/k8s >"$out/k8s-base.yaml" 2>"$out/kustomize.err"; then
    pass "kubectl kustomize deploy/k8s ($(grep -c '^kind:' "$out/k8s-base.yaml") objects)"
    rendered+=("$out/k8s-base.yaml")
  else
    cat "$out/kustomize.err"; bad "kubectl kustomize deploy/k8s"
  fi
  mkdir -p "$out/overlay-pvc"
  cat >"$out/overlay-pvc/kustomization.yaml" <<EOF
resources: [$(realpath --relative-to="$out/overlay-pvc" deploy/k8s)]
components: [$(realpath --relative-to="$out/overlay-pvc" deploy/k8s/components/models-pvc)]
EOF
  if kubectl kustomize "$out/overlay-pvc" >"$out/k8s-pvc.yaml" 2>"$out/kustomize.err"; then
    pass "kubectl kustomize base + components/models-pvc"
    rendered+=("$out/k8s-pvc.yaml")
  else
    cat "$out/kustomize.err"; bad "kubectl kustomize base + components/models-pvc"
  fi
else
  echo "  note  kubectl not installed: validating the base's files as they are (no kustomize render)"
  for f in deploy/k8s/*.yaml; do [ "$(basename "$f")" = kustomization.yaml ] || rendered+=("$f"); done
fi

# the sharded-job manifests (deploy/k8s/jobs): the kustomization plus the merge Job
jobs_files=()
if command -v kubectl >/dev/null; then
  if kubectl kustomize deploy/k8s/jobs >"$out/k8s-jobs.yaml" 2>"$out/kustomize.err"; then
    pass "kubectl kustomize deploy/k8s/jobs ($(grep -c '^kind:' "$out/k8s-jobs.yaml") objects)"
    jobs_files+=("$out/k8s-jobs.yaml")
  else
    cat "$out/kustomize.err"; bad "kubectl kustomize deploy/k8s/jobs"
  fi
else
  jobs_files+=(deploy/k8s/jobs/parts-pvc.yaml deploy/k8s/jobs/shard-job.yaml)
fi
jobs_files+=(deploy/k8s/jobs/merge-job.yaml)
export LENSD_JOB_FILES
LENSD_JOB_FILES=$(IFS=:; echo "${jobs_files[*]}")
if bash -n deploy/slurm/lensd-job.sh; then pass "bash -n deploy/slurm/lensd-job.sh"; else bad "deploy/slurm/lensd-job.sh"; fi

# ------------------------------------------- schemas and consistency (node)
echo "schemas and consistency"
cat >"$tools/validate-deploy.mjs" <<'EOF'
// Schema validation and cross-checks of lensd's deployment files.
// argv: src-dir, rendered k8s files...
import fs from "node:fs";
import path from "node:path";
import YAML from "yaml";
import Ajv from "ajv";
import addFormats from "ajv-formats";

const [src, ...k8sFiles] = process.argv.slice(2);
let fails = 0;
const ok = (m) => console.log(`  ok    ${m}`);
const bad = (m) => { console.log(`  FAIL  ${m}`); fails++; };
const check = (cond, m) => (cond ? ok(m) : bad(m));
const rd = (p) => fs.readFileSync(path.join(src, p), "utf8");

// serve flags from the one table in server/config.c
const flags = [...rd("server/config.c").matchAll(/^\s*\{"([a-z-]+)", "(LENSD_[A-Z_]+)"/gm)]
  .map((m) => ({ flag: m[1], env: m[2] }))
  .filter((f) => !f.flag.startsWith("debug-"));
check(flags.length >= 10, `server/config.c: ${flags.length} serve flags (${flags.map((f) => f.env).join(" ")})`);

// ---------------------------------------------------------------- Kubernetes
const groupDir = (apiVersion) => (apiVersion.includes("/") ? apiVersion : `v1/${apiVersion}`).replace(/^v1\/v1$/, "v1");
async function k8sValidate(obj, where) {
  const dir = obj.apiVersion.includes("/") ? obj.apiVersion : obj.apiVersion; // "apps/v1" or "v1"
  let mod;
  try {
    mod = await import(`kubernetes-models/${dir}/${obj.kind}`);
  } catch (e) {
    return bad(`${where}: no schema for ${obj.apiVersion} ${obj.kind}`);
  }
  try {
    new mod[obj.kind](obj).validate();
    ok(`${where}: ${obj.apiVersion} ${obj.kind} ${obj.metadata?.name}`);
  } catch (e) {
    bad(`${where}: ${obj.kind} ${obj.metadata?.name}: ${e.message}`);
  }
}
void groupDir;
const objects = [];
for (const f of [...k8sFiles, path.join(src, "deploy/k8s/secret.example.yaml")]) {
  for (const doc of YAML.parseAllDocuments(fs.readFileSync(f, "utf8"))) {
    if (doc.errors.length) { bad(`${f}: ${doc.errors[0].message}`); continue; }
    const obj = doc.toJS();
    if (!obj) continue;
    await k8sValidate(obj, path.basename(f));
    if (f === k8sFiles[0] || f.endsWith("secret.example.yaml")) objects.push(obj);
  }
}
const find = (kind, name) => objects.find((o) => o.kind === kind && (!name || o.metadata.name === name));
const dep = find("Deployment");
if (dep) {
  const pod = dep.spec.template;
  const labels = pod.metadata.labels || {};
  const sub = (sel) => sel && Object.entries(sel).every(([k, v]) => labels[k] === v);
  check(sub(dep.spec.selector.matchLabels), "Deployment selector matches its pod labels");
  const svc = find("Service");
  check(svc && sub(svc.spec.selector), "Service selector matches the pod labels");
  const pdb = find("PodDisruptionBudget");
  check(pdb && sub(pdb.spec.selector.matchLabels), "PodDisruptionBudget selector matches the pod labels");
  const hpa = find("HorizontalPodAutoscaler");
  check(hpa && hpa.spec.scaleTargetRef.kind === "Deployment" && hpa.spec.scaleTargetRef.name === dep.metadata.name,
    "HPA targets the Deployment");
  check(hpa && hpa.spec.metrics.some((m) => m.resource?.name === "cpu"), "HPA scales on CPU");
  const c = pod.spec.containers.find((x) => x.name === "lensd");
  const cmName = c.envFrom?.find((e) => e.configMapRef)?.configMapRef.name;
  const cm = find("ConfigMap", cmName);
  check(cm, `env from ConfigMap ${cmName}, which exists`);
  const data = cm?.data || {};
  const missing = flags.filter((f) => !(f.env in data)).map((f) => f.env);
  check(!missing.length, `ConfigMap sets every serve flag${missing.length ? ": missing " + missing : ""}`);
  const secretVol = pod.spec.volumes.find((v) => v.secret);
  const keyMount = c.volumeMounts.find((m) => m.name === secretVol?.name);
  check(secretVol && find("Secret", secretVol.secret.secretName) && keyMount &&
    data.LENSD_API_KEY_FILE?.startsWith(keyMount.mountPath + "/"),
    `API keys: Secret ${secretVol?.secret.secretName} mounted at ${keyMount?.mountPath}, LENSD_API_KEY_FILE=${data.LENSD_API_KEY_FILE}`);
  check(c.livenessProbe?.httpGet?.path === "/healthz" && c.readinessProbe?.httpGet?.path === "/readyz",
    "liveness /healthz, readiness /readyz");
  const portNames = (c.ports || []).map((p) => p.name);
  check([c.livenessProbe, c.readinessProbe, c.startupProbe].filter(Boolean).every((p) => portNames.includes(p.httpGet.port) || Number.isInteger(p.httpGet.port)),
    "probe ports exist");
  check(svc && portNames.includes(svc.spec.ports[0].targetPort), "Service targetPort names a container port");
  const listenPort = Number((data.LENSD_LISTEN || "").split(":").pop());
  check(c.ports?.some((p) => p.containerPort === listenPort), `container port = LENSD_LISTEN port (${listenPort})`);
  const psc = pod.spec.securityContext || {};
  const all = [...(pod.spec.initContainers || []), ...pod.spec.containers];
  check(psc.runAsNonRoot === true && psc.runAsUser > 0, "pod runs as non-root (runAsNonRoot, runAsUser)");
  check(all.every((x) => x.securityContext?.readOnlyRootFilesystem === true &&
    x.securityContext?.allowPrivilegeEscalation === false &&
    (x.securityContext?.capabilities?.drop || []).includes("ALL")),
    "every container: readOnlyRootFilesystem, no privilege escalation, drop ALL");
  const preStop = Number(c.lifecycle?.preStop?.exec?.command?.slice(-1)[0] || 0);
  const drain = Number(data.LENSD_TIMEOUT || 30) + 5;
  const grace = pod.spec.terminationGracePeriodSeconds ?? 30;
  check(grace >= preStop + drain, `terminationGracePeriodSeconds ${grace} >= preStop ${preStop} + drain ${drain} s`);
  const cpu = (q) => (String(q).endsWith("m") ? Number(String(q).slice(0, -1)) / 1000 : Number(q));
  const threads = Number(data.LENSD_WORKERS || 1) * Number(data.LENSD_THREADS_PER_WORKER || 0);
  const lim = cpu(c.resources?.limits?.cpu);
  check(threads > 0 && threads <= lim, `workers x threads-per-worker ${threads} <= CPU limit ${lim}`);
  check(c.resources?.requests?.memory && c.resources?.limits?.memory, "memory requests and limits set");
  const mm = c.volumeMounts.find((m) => m.mountPath === data.LENSD_MODELS_DIR);
  check(mm && mm.readOnly, `models volume mounted read-only at LENSD_MODELS_DIR (${data.LENSD_MODELS_DIR})`);
}

// ------------------------------------------------------------------- Compose
const composeText = rd("deploy/compose/docker-compose.yml");
// interpolate ${VAR:-default} / ${VAR-default} / ${VAR} as compose would with an empty environment
const interpolated = composeText.replace(/\$\{([A-Z0-9_]+)(?::?-([^}]*))?\}/g, (_, v, d) => process.env[v] ?? d ?? "")
  .replace(/\$\$/g, "$");
const compose = YAML.parse(interpolated, { merge: true });
const here = path.dirname(new URL(import.meta.url).pathname);
const schemaPath = path.join(here, "node_modules/dclint/schemas/compose.schema.json");
const schema = JSON.parse(fs.readFileSync(schemaPath, "utf8"));
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
delete schema.$schema; // draft-07, Ajv's default meta-schema (the file names it by an https URL Ajv does not know)
const validate = ajv.compile(schema);
for (const k of Object.keys(compose)) if (k.startsWith("x-")) delete compose[k]; // extension fields are free-form
if (validate(compose)) ok("docker-compose.yml: valid against the Compose Specification schema");
else bad("docker-compose.yml: " + validate.errors.map((e) => `${e.instancePath} ${e.message} ${JSON.stringify(e.params)}`).join("; "));
const services = compose.services || {};
const replicas = Object.keys(services).filter((s) => (services[s].image || "").includes("lensd"));
check(replicas.length === 2, `two lensd replicas (${replicas.join(", ")})`);
for (const r of replicas) {
  const env = services[r].environment || {};
  const missing = flags.filter((f) => !(f.env in env)).map((f) => f.env);
  check(!missing.length, `${r}: every serve flag in environment${missing.length ? ": missing " + missing : ""}`);
  check(!services[r].ports, `${r}: no published ports (only the gateway is public)`);
  check(services[r].read_only === true && (services[r].cap_drop || []).includes("ALL"), `${r}: read-only, cap_drop ALL`);
  check((services[r].secrets || []).length && env.LENSD_API_KEY_FILE?.startsWith("/run/secrets/"), `${r}: API keys from a secret file`);
}
const nginx = rd("deploy/compose/nginx.conf");
const upstream = [...nginx.matchAll(/^\s*server\s+([a-z0-9-]+):(\d+)/gm)].map((m) => m[1]);
check(JSON.stringify(upstream.sort()) === JSON.stringify([...replicas].sort()), `nginx upstream = replicas (${upstream})`);
check(/location\s*=\s*\/metrics\s*\{[^}]*deny all/.test(nginx), "nginx denies /metrics");
check(/client_max_body_size\s+1m;/.test(nginx) && services[replicas[0]]?.environment?.LENSD_MAX_BODY === "1MiB",
  "gateway body limit = LENSD_MAX_BODY (1 MiB)");
const readTimeout = Number((nginx.match(/proxy_read_timeout\s+(\d+)s/) || [])[1]);
check(readTimeout > Number(services[replicas[0]]?.environment?.LENSD_TIMEOUT), `proxy_read_timeout ${readTimeout}s > LENSD_TIMEOUT`);
check(/limit_req\s+zone=/.test(nginx) && /proxy_set_header\s+Authorization/.test(nginx), "rate limit and Authorization forwarded");
const prom = YAML.parse(rd("deploy/compose/prometheus.yml"));
const targets = prom.scrape_configs.find((s) => s.job_name === "lensd").static_configs.flatMap((s) => s.targets);
check(JSON.stringify(targets.map((t) => t.split(":")[0]).sort()) === JSON.stringify([...replicas].sort()),
  `Prometheus scrapes each replica directly (${targets})`);

// ------------------------------------------------------ sharded-job manifests
const jobObjects = [];
for (const f of (process.env.LENSD_JOB_FILES || "").split(":").filter(Boolean)) {
  for (const doc of YAML.parseAllDocuments(fs.readFileSync(f, "utf8"))) {
    if (doc.errors.length) { bad(`${f}: ${doc.errors[0].message}`); continue; }
    const obj = doc.toJS();
    if (!obj) continue;
    await k8sValidate(obj, path.basename(f));
    jobObjects.push(obj);
  }
}
const shardJob = jobObjects.find((o) => o.kind === "Job" && o.spec.completionMode === "Indexed");
const mergeJob = jobObjects.find((o) => o.kind === "Job" && o !== shardJob);
check(shardJob && mergeJob, "deploy/k8s/jobs: an Indexed Job and a merge Job");
if (shardJob && mergeJob) {
  const spec = shardJob.spec, c = spec.template.spec.containers[0];
  const env = Object.fromEntries((c.env || []).map((e) => [e.name, e.value]));
  check(spec.completions === Number(env.LENSD_JOB_SHARDS) && spec.parallelism <= spec.completions,
    `completions = LENSD_JOB_SHARDS (${spec.completions}), parallelism ${spec.parallelism} <= completions`);
  check(spec.backoffLimitPerIndex >= 1 && spec.maxFailedIndexes === 0 && spec.template.spec.restartPolicy === "Never",
    "per-index retries, no failed index tolerated (a merge needs every shard), restartPolicy Never");
  const args = c.args.join(" ");
  check(/^job run /.test(args) && args.includes("--shards $(LENSD_JOB_SHARDS)") && /--out \/parts\/\S*\{index\}/.test(args),
    "shard args: lensd job run --shards $(LENSD_JOB_SHARDS) --out /parts/...{index}...");
  const claim = (job, name) => job.spec.template.spec.volumes.find((v) => v.name === name)?.persistentVolumeClaim?.claimName;
  const modelsPvc = YAML.parse(rd("deploy/k8s/components/models-pvc/pvc.yaml")).metadata.name;
  check(claim(shardJob, "models") === modelsPvc && claim(mergeJob, "models") === modelsPvc,
    `models from the Deployment's claim (${modelsPvc})`);
  const partsPvc = jobObjects.find((o) => o.kind === "PersistentVolumeClaim" && o.metadata.name === claim(shardJob, "parts"));
  check(partsPvc?.spec.accessModes.includes("ReadWriteMany") && claim(mergeJob, "parts") === partsPvc.metadata.name,
    `partials on a ReadWriteMany claim (${partsPvc?.metadata.name}) shared with the merge Job`);
  const outPattern = (args.match(/--out (\S+)/) || [])[1] || "";
  check(mergeJob.spec.template.spec.containers[0].args.join(" ").includes(outPattern.replace("{index}", "*")),
    `the merge reads what the shards write (${outPattern.replace("{index}", "*")})`);
  const pods = [shardJob, mergeJob].map((j) => j.spec.template.spec);
  check(pods.every((p) => p.securityContext?.runAsNonRoot && p.containers.every((x) =>
    x.securityContext?.readOnlyRootFilesystem && x.securityContext?.allowPrivilegeEscalation === false)),
    "job pods: non-root, read-only root filesystem, no privilege escalation");
}

// ---------------------------------------------------------------- Dockerfile
const dockerfile = rd("Dockerfile");
const missingEnv = flags.filter((f) => !new RegExp(`^\\s*(ENV\\s+)?${f.env}=`, "m").test(dockerfile)).map((f) => f.env);
check(!missingEnv.length, `Dockerfile declares every LENSD_* variable${missingEnv.length ? ": missing " + missingEnv : ""}`);
check(/^USER\s+10001/m.test(dockerfile) && /^HEALTHCHECK .*\n?.*healthz/m.test(dockerfile) && /^VOLUME/m.test(dockerfile) &&
  /^EXPOSE 8080/m.test(dockerfile), "Dockerfile: USER 10001, HEALTHCHECK /healthz, VOLUME, EXPOSE 8080");
process.exit(fails ? 1 : 0);
EOF
if node "$tools/validate-deploy.mjs" "$src" "${rendered[@]}"; then :; else fails=$((fails + 1)); fi

echo "dclint"
if "$tools/node_modules/.bin/dclint" deploy/compose/docker-compose.yml --color false -q \
     --disable-rule no-unbound-port-interfaces 2>&1 | grep -v 'Unknown user config' >"$out/dclint.txt"; then :; fi
if grep -q 'error' "$out/dclint.txt"; then cat "$out/dclint.txt"; bad "dclint"; else pass "dclint docker-compose.yml (rules; ports published on purpose)"; fi

# ---------------------------------------------------------------- nginx -t
echo "nginx -t"
ng=$out/nginx
mkdir -p "$ng/logs"
sed -e 's/server lensd-\([0-9]\):8080/server 127.0.0.1:1808\1/' -e "s#^pid .*#pid $ng/nginx.pid;#" \
  -e 's/listen \[::\]:8080;//' deploy/compose/nginx.conf >"$ng/nginx.conf"
if "$NGINX" -t -q -p "$ng" -c "$ng/nginx.conf" -e stderr 2>"$ng/t.err"; then
  pass "nginx -t deploy/compose/nginx.conf ($("$NGINX" -v 2>&1 | sed 's/.*\///'))"
else
  cat "$ng/t.err"; bad "nginx -t deploy/compose/nginx.conf"
fi

if [ "$fails" -ne 0 ]; then
  echo "validate-deploy: $fails check group(s) failed"
  exit 1
fi
echo "validate-deploy: all checks passed"
