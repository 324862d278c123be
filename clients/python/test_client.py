#!/usr/bin/python3
"""test_client.py - the Python client against a live build/lensd (make test).

Starts build/lensd ($BUILD/lensd) on the demo models in models/ with
--models-dir models (run-time loading) and --debug-delay-ms (so a job can be
cancelled while it waits), runs every ```python block of
clients/python/README.md as written (the notebook session), then checks
each client method against the server's own answers and the error paths.
Run by Debian's /usr/bin/python3 (scripts/deps.sh test gives it numpy).
Prints "python_client: N passed, N failed, N skipped" for scripts/run-tests.sh."""
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from lensd import Client, Job, LensdError, LensdUnreachable, ModelInfo, tensor  # noqa: E402

passed = failed = skipped = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL {what}", file=sys.stderr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port):
    lensd = os.path.join(ROOT, os.environ.get("BUILD") or "build", "lensd")
    models = os.path.join(ROOT, "models")
    log = open(f"/tmp/lensd-pyclient-{os.getpid()}.log", "w")
    proc = subprocess.Popen([lensd, "serve", "--listen", f"127.0.0.1:{port}", "--models-dir", models,
                             "--debug-delay-ms", "300", "--workers", "2"], stderr=log, cwd=ROOT)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
            return proc
        except Exception:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"lensd did not start; see {log.name}")


def run_readme(url):
    """Every ```python block of README.md, in order, in one namespace."""
    text = open(os.path.join(HERE, "README.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    check(len(blocks) >= 5, f"README has {len(blocks)} python blocks (want >= 5)")
    ns = {}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block.replace("http://127.0.0.1:8080", url), f"README block {i}", "exec"), ns)
            check(True, "")
        except Exception as e:  # a block that raises is a failed check, with its error
            check(False, f"README block {i}: {type(e).__name__}: {e}")
    return ns


def test_methods(c: Client):
    check(c.healthz() == {"status": "ok"} and c.readyz()["status"] == "ready", "healthz / readyz")
    check("lensd_requests_total" in c.metrics(), "metrics text")
    check(c.info()["version"], "info")
    check(c.openapi().startswith("openapi: 3"), "openapi.yaml")
    caps = c.capabilities()
    check(len(caps.job_kinds) >= 6 and any(a["name"] == "forward" for a in caps.analyses), "capabilities")
    ms = c.models()
    check({"demo-sst2", "demo-mlm", "demo-gpt2"} <= {m.id for m in ms.models} and ms.failed == [], "models")
    sst2 = c.model("demo-sst2")
    check(isinstance(sst2, ModelInfo) and sst2.task == "classification" and sst2.memory_bytes > 0, "model")
    tok = c.tokenize("a charming film", model="demo-sst2")
    check([t["text"] for t in tok["tokens"]] == ["[CLS]", "a", "charming", "film", "[SEP]"], "tokenize")
    det = c.detokenize(tok["input_ids"], model="demo-sst2", skip_special_tokens=True)
    check(det["text"] == "a charming film", f"detokenize: {det['text']!r}")
    f = c.forward("a charming film", model="demo-sst2")
    check(f["label"] == "positive" and abs(sum(f["probs"]) - 1) < 1e-5, "forward")
    check(len(c.attention("a charming film", model="demo-sst2", layers=[1])["layers"]) == 1, "attention")
    attr = c.attribution("a charming film", model="demo-sst2", steps=4)
    check(attr["steps"] == 4 and len(attr["tokens"]) == 5 and attr["layers"], "attribution")
    check(c.token_identity("a charming film", model="demo-sst2")["model"] == "demo-sst2", "token_identity")
    check(c.hidden_attribution("a charming film", model="demo-sst2")["model"] == "demo-sst2", "hidden_attribution")
    cm = c.context_mixing("a charming film", "alti", model="demo-sst2", layers=[2])
    check(cm["method"] == "alti" and [y["layer"] for y in cm["layers"]] == [2]
          and all(abs(sum(row) - 1) < 1e-5 for row in cm["layers"][0]["rollout"]), "context_mixing")
    dx = c.context_mixing("a charming film", "decompx", model="demo-sst2")
    check(dx["method"] == "decompx" and all(abs(sum(r[k] for r in dx["classifier"]["contributions"]) - f["logits"][k])
                                            < 1e-4 for k in range(len(f["logits"]))), "context_mixing decompx")
    obj = c.attribution("The film was", model="demo-gpt2", steps=2, include_matrices=False,
                        objective={"kind": "logit_difference", "target": " good", "foil": " bad"})
    check(obj["objective"]["kind"] == "logit_difference" and obj["objective"]["foil"]["label"], "attribution objective")
    dla = c.logit_attribution("The film was", " good", model="demo-gpt2", foil=" bad")
    check(abs(dla["total"] - dla["logit"]) < 1e-4 * max(1, abs(dla["logit"])) and dla["foil"]["id"] != dla["target"]["id"],
          "logit_attribution")
    abl = c.ablation("a charming film", heads=[(1, 0), (2, 1)], mlps=[1], mode="mean", model="demo-sst2")
    check(abs(abl["objective"]["change"] - (abl["objective"]["ablated"] - abl["objective"]["clean"])) < 1e-6
          and len(abl["probs"]["ablated"]) == 2, "ablation")
    pat = c.patching("a charming film", "a dreadful film", model="demo-sst2")
    check(len(pat["resid"]) == 2 and all(len(row) == len(pat["tokens"]) for row in pat["resid"]), "patching")
    pat = c.patching("a charming film", "a dreadful film", targets=["heads", "mlps"], method="both", model="demo-sst2")
    check(len(pat["heads"]) == 2 and len(pat["attribution"]["mlps"]) == 2 and "resid" not in pat, "patching grids")
    batch = c.attention(["a film", "awful"], model="demo-sst2", layers=[1])
    check(len(batch["results"]) == 2, "batch attention")
    # run-time models: load, use, unload
    info = c.load_model("mlm2", "demo-mlm")
    check(info.id == "mlm2" and info.task == "masked-lm", "load_model")
    check(c.forward("a [MASK] film", model="mlm2", outputs=["top_k"], k=2)["top_k"][0]["position"] == 2,
          "forward on the loaded model")
    check(c.unload_model("mlm2")["unloaded"] is True, "unload_model")


def test_errors(c: Client):
    cases = [
        (lambda: c.forward("x", model="nope"), 404, "model_not_found", "model"),
        (lambda: c.forward("", model="demo-sst2"), 422, "invalid_request", "text"),
        (lambda: c.forward("x", model="demo-sst2", logit_lens=True), 422, "invalid_request", "logit_lens"),
        (lambda: c.router("x", model="demo-sst2"), 422, "invalid_request", "outputs"),  # no experts
        (lambda: c.load_model("x", "../outside"), 422, "invalid_request", "path"),
        (lambda: c.load_model("demo-sst2", "demo-sst2"), 409, "model_exists", "id"),
        (lambda: c.job("0123456789abcdef"), 404, "job_not_found", "id"),
        (lambda: c.jobs(state="finished"), 422, "invalid_request", "state"),
        (lambda: c.submit_job("nope", {}), 422, "invalid_request", "kind"),
    ]
    check(len(cases) == 9, "9 error cases")
    for call, status, code, field in cases:
        try:
            call()
            check(False, f"no error raised, want {status} {code}")
        except LensdError as e:
            check((e.status, e.code, e.field) == (status, code, field),
                  f"got {e.status} {e.code} {e.field}, want {status} {code} {field}")


def test_values(c: Client):
    """numpy / integral-float inputs, and base64 tensors decoded. Debian's
    /usr/bin/python3 with python3-numpy (scripts/deps.sh test) runs it."""
    global skipped
    try:
        import numpy as np
    except ImportError:
        skipped += 1
        print(f"SKIP: no numpy for {sys.executable} (scripts/deps.sh test installs python3-numpy): "
              "numpy inputs and tensor() not checked")
        return
    plain = c.forward("a charming film", model="demo-sst2", outputs=["logits", "attentions"], layers=[1], heads=[0])
    floats = c.forward("a charming film", model="demo-sst2", outputs=["logits", "attentions"], layers=[1.0],
                       heads=np.array([0]))
    check(floats["logits"] == plain["logits"], "layers=[1.0] and heads=np.array([0]) ask what [1] and [0] do")
    ids = np.array([t["id"] for t in c.tokenize("a charming film", model="demo-sst2")["tokens"]], dtype=np.int64)
    by_ids = c._request("POST", "/v1/forward", {"model": "demo-sst2", "input_ids": ids, "outputs": ["logits"]})
    check(by_ids["logits"] == plain["logits"], "input_ids as a numpy int64 array")
    b64 = c.forward("a charming film", model="demo-sst2", outputs=["attentions"], layers=[1], heads=[0],
                    format={"encoding": "base64", "precision": 9})
    nine = c.forward("a charming film", model="demo-sst2", outputs=["attentions"], layers=[1], heads=[0],
                     format={"precision": 9})
    att_b64, att_json = b64["attentions"][0]["heads"][0]["weights"], nine["attentions"][0]["heads"][0]["weights"]
    a, want = tensor(att_b64), np.array(att_json, dtype=np.float32)
    check(isinstance(a, np.ndarray) and a.shape == want.shape and np.array_equal(a, want),
          f"tensor(base64) = the JSON matrix at 9 digits ({getattr(a, 'shape', None)} vs {want.shape})")
    lists = tensor(att_b64, numpy=False)
    check(isinstance(lists, list) and np.array_equal(np.array(lists, dtype=np.float32), want),
          "tensor(base64, numpy=False): nested lists of the same values")
    check(np.array_equal(tensor(att_json), want), "tensor(nested lists) -> the same array")
    down = Client("http://127.0.0.1:9", timeout=5)  # port 9 (discard): nothing listens
    try:
        down.healthz()
        check(False, "a server that is down raises")
    except LensdUnreachable as e:
        check(e.status == 0 and e.code == "unreachable" and isinstance(e, LensdError), f"server down: {e}")


def test_jobs(c: Client):
    updates = []
    job = c.run_job("hidden-attribution", {"model": "demo-sst2", "text": "a charming film"}, progress=updates.append)
    check(isinstance(job, Job) and job.state == "done" and job.result and updates[-1].state == "done",
          "run_job: done with progress updates")
    check(any(u.state == "running" for u in updates), "progress saw the running state")
    # cancel: the job waits --debug-delay-ms before it runs; cancel on the first update
    job = c.run_job("hidden-attribution", {"model": "demo-sst2", "text": "a charming film"}, cancel=lambda: True)
    check(job.state == "cancelled" and job.error and job.error["code"] == "cancelled", f"cancel: {job.state}")
    table = c.faithfulness(["a charming film", "dull and far too long", "a small gem"], model="demo-sst2",
                           methods=["random", "attention", "leave-one-out"], fractions=[0, 0.5, 1])
    rows = {m["method"]: m for m in table["methods"]}
    check(table["n_examples"] == 3 and list(rows) == ["random", "attention", "leave-one-out"] and
          all(len(m["deletion_curve"]) == 3 and abs(m["deletion_curve"][0] - table["full"]) < 1e-5 and
              abs(m["deletion_curve"][2] - table["empty"]) < 1e-5 for m in rows.values()),
          f"faithfulness: a table of 3 methods whose curves run from full to empty: {table}")
    heads = c.faithfulness(["a charming film", "dull and far too long"], model="demo-sst2", unit="heads",
                           fractions=[0, 1])
    check(heads["unit"] == "heads" and heads["removal"] == "zero-ablate" and
          [m["method"] for m in heads["methods"]] == ["random", "attention-attribution"] and
          all(abs(m["deletion_curve"][0] - heads["full"]) < 1e-5 and abs(m["deletion_curve"][1] - heads["empty"]) < 1e-5
              for m in heads["methods"]), f"faithfulness unit heads: {heads}")
    try:
        c.faithfulness(["a charming film"], model="demo-sst2", unit="heads", methods=["rollout"])
        check(False, "a token method with unit heads raises")
    except LensdError as e:
        check(e.status == 422 and e.field == "params.methods", f"rollout with unit heads: {e}")
    try:
        c.faithfulness(["a charming film"], model="demo-sst2", methods=["saliency"])
        check(False, "an unknown faithfulness method raises")
    except LensdError as e:
        check(e.status == 422 and e.field == "params.methods", f"unknown method: {e}")
    texts = ["a charming film", "the plot is thin", "boring", "a moving story"]
    one = c.context_mixing_job(texts, model="demo-sst2", methods=["rollout", "alti"])
    by = {m["method"]: m["layers"] for m in one["methods"]}
    check(one["n_texts"] == 4 and list(by) == ["rollout", "alti"] and len(by["alti"]) == 2
          and all(0 < l["self"] < 1 and 0 < l["first_rollout"] < 1 for l in by["alti"]),
          f"context_mixing_job: {one}")
    # layer 1's rolled-out matrix is its own matrix; the mean of a text's diagonal is what /v1/context-mixing gives
    check(by["alti"][0]["self"] == by["alti"][0]["self_rollout"], "layer 1: rollout = contributions")
    solo = c.context_mixing_job(texts[:1], model="demo-sst2", methods=["alti"])["methods"][0]["layers"]
    cm = c.context_mixing(texts[0], "alti", model="demo-sst2")["layers"]
    for l in range(2):
        for key, mat in (("self", cm[l]["contributions"]), ("self_rollout", cm[l]["rollout"])):
            want = sum(mat[i][i] / sum(mat[i]) for i in range(len(mat))) / len(mat)
            check(abs(solo[l][key] - want) < 1e-5, f"context_mixing_job layer {l + 1} {key}: {solo[l][key]} vs {want}")
        want = sum(row[0] / sum(row) for row in cm[l]["contributions"]) / len(cm[l]["contributions"])
        check(abs(solo[l]["first"] - want) < 1e-5, f"context_mixing_job layer {l + 1} first: {solo[l]['first']} vs {want}")
    try:
        c.context_mixing_job(texts, model="demo-sst2", methods=["rollout", "rollout"])
        check(False, "a repeated method raises")
    except LensdError as e:
        check(e.status == 422 and e.field == "params.methods", f"repeated method: {e}")
    try:
        c.run_job("hidden-attribution", {"model": "demo-sst2", "text": "a charming film", "method": "nope"})
        check(False, "a bad job param raises")
    except LensdError as e:
        check(e.status == 422 and e.field and e.field.startswith("params."), f"bad job param: {e}")


def main():
    port = free_port()
    proc = start_server(port)
    url = f"http://127.0.0.1:{port}"
    try:
        c = Client(url)
        run_readme(url)
        test_methods(c)
        test_errors(c)
        test_values(c)
        test_jobs(c)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            check(proc.wait(timeout=30) == 0, "lensd exits cleanly")
        except subprocess.TimeoutExpired:
            proc.kill()
            check(False, "lensd did not exit")
    print(f"python_client: {passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
