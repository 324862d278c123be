#!/usr/bin/env python3
"""openapi_validate.py - every response the HTTP tests received, checked
against openapi.yaml by a validator independent of tests/http_util.h's.

tests/http_util.h appends each response to $LENSD_RESPONSE_LOG (one JSON
line: method, path, status, content_type, body); `make test` points it at
$BUILD/responses.jsonl and runs this script after the test binaries. The
spec is read with PyYAML (not the C tests' YAML reader) and each body is
validated by the JSON Schema subset below, written for this file: $ref,
type, nullable, enum, required, properties, additionalProperties (false is
enforced: a field the spec does not name fails), items, oneOf (exactly one
alternative, or the discriminator's), allOf, anyOf, minimum, maximum.
Every (path, method, status) must be documented with the response's content
type; paths no route matches must answer the Error schema with 404, other
methods on a known path 405 (or 204 for OPTIONS; or 401 under /v1/, where
the API key is checked first). The dashboard's static files (/, /web/...) are
outside the API (tests/test_http_web.c checks them): left out and counted
apart, neither passed nor skipped. Fails when the log is
missing or holds fewer than 500 responses (the suite sends thousands).
Prints "openapi_responses: N passed, N failed, N skipped"."""
import json
import os
import re
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MIN_RESPONSES = 500


class Invalid(Exception):
    pass


class StrictLoader(yaml.SafeLoader):
    """safe_load keeps the last of two equal keys in a mapping; a spec with
    such a key says two things of one field, so it is refused."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicated key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, StrictLoader.construct_mapping)


class Validator:
    def __init__(self, spec):
        self.spec = spec

    def resolve(self, schema):
        while "$ref" in schema:
            ref = schema["$ref"]
            if not ref.startswith("#/"):
                raise Invalid(f"unsupported $ref {ref}")
            node = self.spec
            for part in ref[2:].split("/"):
                node = node[part]
            schema = node
        return schema

    def check(self, schema, v, where):
        schema = self.resolve(schema)
        if v is None and schema.get("nullable"):
            return
        for sub in schema.get("allOf", []):
            self.check(sub, v, where)
        if "anyOf" in schema:
            if not any(self.ok(sub, v, where) for sub in schema["anyOf"]):
                raise Invalid(f"{where}: matches no anyOf alternative")
        if "oneOf" in schema:
            disc = schema.get("discriminator")
            if disc and isinstance(v, dict) and v.get(disc["propertyName"]) in disc.get("mapping", {}):
                self.check({"$ref": disc["mapping"][v[disc["propertyName"]]]}, v, where)
            else:
                errors = []
                matched = 0
                for sub in schema["oneOf"]:
                    try:
                        self.check(sub, v, where)
                        matched += 1
                    except Invalid as e:
                        errors.append(str(e))
                if matched != 1:
                    raise Invalid(f"{where}: matches {matched} oneOf alternatives ({'; '.join(errors)[:300]})")
        t = schema.get("type")
        if t and not self.type_ok(t, v):
            raise Invalid(f"{where}: {json.dumps(v)[:60]} is not {t}")
        if "enum" in schema and v not in schema["enum"]:
            raise Invalid(f"{where}: {v!r} not in {schema['enum']}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if "minimum" in schema and v < schema["minimum"]:
                raise Invalid(f"{where}: {v} < minimum {schema['minimum']}")
            if "maximum" in schema and v > schema["maximum"]:
                raise Invalid(f"{where}: {v} > maximum {schema['maximum']}")
        if isinstance(v, dict):
            props = schema.get("properties", {})
            for name in schema.get("required", []):
                if name not in v:
                    raise Invalid(f"{where}: missing required {name!r}")
            extra = schema.get("additionalProperties", True)
            for k, x in v.items():
                if k in props:
                    self.check(props[k], x, f"{where}.{k}")
                elif extra is False:
                    raise Invalid(f"{where}: {k!r} is not in the schema (additionalProperties: false)")
                elif isinstance(extra, dict):
                    self.check(extra, x, f"{where}.{k}")
        if isinstance(v, list) and "items" in schema:
            for i, x in enumerate(v):
                self.check(schema["items"], x, f"{where}[{i}]")

    def ok(self, schema, v, where):
        try:
            self.check(schema, v, where)
            return True
        except Invalid:
            return False

    @staticmethod
    def type_ok(t, v):
        return {
            "object": isinstance(v, dict),
            "array": isinstance(v, list),
            "string": isinstance(v, str),
            "boolean": isinstance(v, bool),
            "integer": isinstance(v, int) and not isinstance(v, bool),
            "number": isinstance(v, (int, float)) and not isinstance(v, bool),
        }.get(t, False)


def match_path(spec_paths, path):
    path = path.split("?", 1)[0]
    for template in spec_paths:
        pattern = "^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(template)) + "$"
        if re.match(pattern, path):
            return template
    return None


def is_static(path):
    """The dashboard's files (--web-dir, server/web.c): outside the API and the spec."""
    path = path.split("?", 1)[0]
    return path == "/" or path.startswith("/web/") or path == "/web"


def validate(spec, rec, val):
    method = {"HEAD": "get"}.get(rec["method"], rec["method"].lower())
    status = str(rec["status"])
    ctype = rec["content_type"].split(";")[0].strip()
    template = match_path(spec["paths"], rec["path"])
    error_schema = {"$ref": "#/components/schemas/Error"}
    if template is None or method not in spec["paths"][template]:
        if rec["method"] == "OPTIONS" and template and status == "204":
            return
        want = "404" if template is None else "405"
        # with API keys every /v1 path is checked for the key before its route (401 first)
        keyed = rec["path"].split("?", 1)[0].startswith("/v1/") and status == "401"
        if status != want and not keyed:
            raise Invalid(f"{rec['method']} {rec['path']}: undocumented, answered {status} (want {want})")
        if rec["method"] != "HEAD":
            val.check(error_schema, json.loads(rec["body"]), "$")
        return
    responses = spec["paths"][template][method]["responses"]
    resp = responses.get(status) or responses.get("default")
    if resp is None:
        raise Invalid(f"{rec['method']} {template}: status {status} is not documented")
    content = resp.get("content", {})
    if rec["method"] == "HEAD" or not rec["body"]:
        if content and rec["method"] != "HEAD":
            raise Invalid(f"{rec['method']} {template} {status}: empty body, spec documents {list(content)}")
        return
    if ctype not in content:
        raise Invalid(f"{rec['method']} {template} {status}: content type {ctype!r} not in {list(content)}")
    if ctype == "application/json":
        val.check(content[ctype]["schema"], json.loads(rec["body"]), "$")


def main():
    log = os.environ.get("LENSD_RESPONSE_LOG") or os.path.join(ROOT, os.environ.get("BUILD") or "build",
                                                               "responses.jsonl")
    passed = failed = 0
    with open(os.path.join(ROOT, "openapi.yaml")) as f:
        spec = yaml.load(f, Loader=StrictLoader)
    val = Validator(spec)
    records = []
    if os.path.exists(log):
        with open(log) as f:
            records = [json.loads(line) for line in f if line.strip()]
    if len(records) < MIN_RESPONSES:
        print(f"FAIL {log}: {len(records)} responses logged (want >= {MIN_RESPONSES}); run the HTTP tests first",
              file=sys.stderr)
        failed += 1
    seen_ops = set()
    static = 0
    for rec in records:
        if is_static(rec["path"]):
            static += 1  # outside the API: counted apart, never as passes
            continue
        try:
            validate(spec, rec, val)
            passed += 1
            t = match_path(spec["paths"], rec["path"])
            if t:
                seen_ops.add((t, rec["method"]))
        except (Invalid, ValueError, KeyError) as e:
            failed += 1
            if failed <= 40:
                print(f"FAIL {e}", file=sys.stderr)
    print(f"{len(records)} responses over {len(seen_ops)} (path, method) pairs checked against openapi.yaml")
    if static:
        print(f"{static} responses of the dashboard's static files (/, /web/...) left out: not part of openapi.yaml")
    print(f"openapi_responses: {passed} passed, {failed} failed, 0 skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
