"""lensd: a Python client for the lensd HTTP API (standard library only).

One method per operation of openapi.yaml. Responses that have a fixed shape
come back as dataclasses (ModelInfo, Job, ...); the analysis responses, whose
shape depends on the request's options, as typed dicts. Every error answer
raises LensdError carrying the HTTP status and the server's code, message and
field; a server that cannot be reached raises LensdUnreachable (a
LensdError with status 0 and code "unreachable"). Request values may be
numpy scalars and arrays, and integral floats (3.0) pass where the API wants
an integer. tensor() turns a float array of a response (a base64 tensor
from format {"encoding": "base64"}, or nested lists) into a numpy array, or
into nested lists without numpy.

    from lensd import Client
    c = Client("http://127.0.0.1:8080")
    c.forward("a charming [MASK] .", model="demo-mlm", outputs=["top_k"], k=5)
"""
from __future__ import annotations

import base64
import json
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, TypedDict

__all__ = [
    "Client", "LensdError", "LensdUnreachable", "tensor", "ModelInfo", "FailedModel", "Models", "Job", "JobList", "Capabilities",
    "Prediction", "Token",
]


class LensdError(Exception):
    """An error answer: {"error": {"code", "message", "field"}} with its HTTP status."""

    def __init__(self, status: int, code: str, message: str, field: Optional[str] = None,
                 retry_after: Optional[float] = None):
        super().__init__(f"{status} {code}: {message}" + (f" (field {field})" if field else ""))
        self.status, self.code, self.message, self.field = status, code, message, field
        self.retry_after = retry_after


class LensdUnreachable(LensdError):
    """No answer: the connection was refused, timed out or broke (status 0)."""

    def __init__(self, url: str, reason: str):
        super().__init__(0, "unreachable", f"no answer from {url}: {reason}")
        self.url = url


def _plain(value):
    """A request value as JSON can carry it: numpy arrays and scalars become
    lists and Python numbers (via tolist / item), and a float with an
    integral value (3.0) an int, as integer fields require; a fractional
    float stays a float."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    elif hasattr(value, "item") and not isinstance(value, (str, bytes, dict, list, tuple)):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def tensor(value, numpy: Optional[bool] = None):
    """A float array of a response as a numpy array (numpy=True, or None when
    numpy is installed) or nested lists (numpy=False). value is a base64
    tensor {"dtype": "float32", "shape", "data"} (format {"encoding":
    "base64"}) or nested lists of numbers (None for NaN / infinity)."""
    if numpy is None:
        try:
            import numpy as _np  # noqa: F401
            numpy = True
        except ImportError:
            numpy = False
    if isinstance(value, dict):
        if value.get("dtype") != "float32":
            raise ValueError(f"unknown tensor dtype {value.get('dtype')!r}")
        shape = [int(n) for n in value["shape"]]
        raw = base64.b64decode(value["data"])
        count = 1
        for n in shape:
            count *= n
        if len(raw) != 4 * count:
            raise ValueError(f"tensor of shape {shape} needs {4 * count} bytes, has {len(raw)}")
        if numpy:
            import numpy as np
            return np.frombuffer(raw, dtype="<f4").reshape(shape).copy()
        flat = list(struct.unpack(f"<{count}f", raw))
        for n in reversed(shape[1:]):
            flat = [flat[i:i + n] for i in range(0, len(flat), n)]
        return flat
    if numpy:
        import numpy as np
        nan = float("nan")
        return np.array(_nulls_to(value, nan), dtype=np.float32)
    return value


def _nulls_to(value, fill):
    if isinstance(value, list):
        return [_nulls_to(v, fill) for v in value]
    return fill if value is None else value


def _build(cls, data: Dict[str, Any]):
    """A dataclass from a JSON object: known keys only (newer servers may add some)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass
class ModelInfo:
    id: str
    architecture: Optional[str]  # None for a folder holding only tokenizer files
    model_type: Optional[str]    # None for a folder holding only tokenizer files
    num_layers: int
    num_heads: int
    hidden_size: int
    head_dim_key: int
    head_dim_value: int
    vocab_size: int
    max_positions: int
    labels: Optional[List[str]]
    task: Optional[str]          # None for a folder holding only tokenizer files
    parameters: int
    bytes: int
    memory_bytes: int = 0
    analyses: List[str] = field(default_factory=list)
    random_weights: bool = False
    tokenizer: bool = True


@dataclass
class FailedModel:
    id: str
    error: str


@dataclass
class Models:
    models: List[ModelInfo]
    failed: List[FailedModel]


@dataclass
class Job:
    id: str
    kind: str
    state: str
    progress: float
    model: Optional[str]
    created: str
    started: Optional[str] = None
    finished: Optional[str] = None
    expires: Optional[str] = None
    result: Optional[Dict[str, Any]] = None
    error: Optional[Dict[str, Any]] = None

    @property
    def finished_state(self) -> bool:
        return self.state in ("done", "failed", "cancelled")


@dataclass
class JobList:
    jobs: List[Job]
    total: int


@dataclass
class Capabilities:
    analyses: List[Dict[str, Any]]
    job_kinds: List[Dict[str, Any]]
    data_dir: bool
    data_files: List[Dict[str, Any]]


class Token(TypedDict):
    id: int
    text: str
    start: Optional[int]
    end: Optional[int]
    special: bool
    segment: int                 # the template's token type id (RoBERTa: 0 for both texts)
    text_index: Optional[int]    # 0 text, 1 text_pair; None for template tokens and input_ids


class Prediction(TypedDict):
    id: int
    token: str
    prob: float


class Client:
    """A lensd server at base_url; api_key is sent as a bearer token."""

    def __init__(self, base_url: str = "http://127.0.0.1:8080", api_key: Optional[str] = None,
                 timeout: float = 120.0):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    # ------------------------------------------------------------ transport

    def _request(self, method: str, path: str, body: Optional[Dict[str, Any]] = None,
                 query: Optional[Dict[str, Any]] = None, raw: bool = False):
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = json.dumps(_plain(body)).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                payload = resp.read()
        except urllib.error.HTTPError as e:
            raise self._error(e) from None
        except (urllib.error.URLError, OSError) as e:  # refused, timed out, reset
            raise LensdUnreachable(self.base_url, str(getattr(e, "reason", e))) from None
        if raw:
            return payload.decode()
        return json.loads(payload) if payload else None

    @staticmethod
    def _error(e: urllib.error.HTTPError) -> LensdError:
        body = e.read()
        retry = e.headers.get("Retry-After")
        try:
            err = json.loads(body)["error"]
            return LensdError(e.code, err["code"], err["message"], err.get("field"),
                              float(retry) if retry else None)
        except (ValueError, KeyError, TypeError):
            return LensdError(e.code, "http_error", body.decode(errors="replace")[:200])

    @staticmethod
    def _body(**kw) -> Dict[str, Any]:
        return {k: v for k, v in kw.items() if v is not None}

    @staticmethod
    def _text_fields(text) -> Dict[str, Any]:
        """text: a string, or a list of strings (a batch: the answer is {"results": [...]})."""
        return {"texts": list(text)} if isinstance(text, (list, tuple)) else {"text": text}

    # -------------------------------------------------------------- service

    def healthz(self) -> Dict[str, Any]:
        return self._request("GET", "/healthz")

    def readyz(self) -> Dict[str, Any]:
        return self._request("GET", "/readyz")

    def metrics(self) -> str:
        return self._request("GET", "/metrics", raw=True)

    def info(self) -> Dict[str, Any]:
        return self._request("GET", "/v1/info")

    def openapi(self) -> str:
        return self._request("GET", "/openapi.yaml", raw=True)

    def capabilities(self) -> Capabilities:
        return _build(Capabilities, self._request("GET", "/v1/capabilities"))

    # --------------------------------------------------------------- models

    def models(self) -> Models:
        d = self._request("GET", "/v1/models")
        return Models([_build(ModelInfo, m) for m in d["models"]], [_build(FailedModel, f) for f in d["failed"]])

    def model(self, id: str) -> ModelInfo:
        return _build(ModelInfo, self._request("GET", f"/v1/models/{urllib.parse.quote(id)}"))

    def load_model(self, id: str, path: str) -> ModelInfo:
        return _build(ModelInfo, self._request("POST", "/v1/models", {"id": id, "path": path}))

    def unload_model(self, id: str) -> Dict[str, Any]:
        return self._request("DELETE", f"/v1/models/{urllib.parse.quote(id)}")

    # ------------------------------------------------------------- analyses

    def tokenize(self, text: str, model: Optional[str] = None, text_pair: Optional[str] = None) -> Dict[str, Any]:
        return self._request("POST", "/v1/tokenize", self._body(model=model, text=text, text_pair=text_pair))

    def detokenize(self, ids: Sequence[int], model: Optional[str] = None,
                   skip_special_tokens: Optional[bool] = None) -> Dict[str, Any]:
        return self._request("POST", "/v1/detokenize",
                             self._body(model=model, ids=list(ids), skip_special_tokens=skip_special_tokens))

    def forward(self, text, model: Optional[str] = None, **options) -> Dict[str, Any]:
        """options: outputs, layers, heads, positions, k, logit_lens, format, text_pair / text_pairs."""
        return self._request("POST", "/v1/forward", {**self._body(model=model), **self._text_fields(text), **options})

    def router(self, text, model: Optional[str] = None, probs: bool = False, **options) -> List[Dict[str, Any]]:
        """The mixture-of-experts routes of one text (forward's outputs router / router_probs): per MoE
        layer {layer, experts [T][K], weights [T][K], probs [T][E] when probs}. options: layers, format."""
        return self.forward(text, model=model, outputs=["router_probs" if probs else "router"], **options)["router"]

    def attention(self, text, model: Optional[str] = None, **options) -> Dict[str, Any]:
        return self._request("POST", "/v1/attention", {**self._body(model=model), **self._text_fields(text), **options})

    def attribution(self, text, model: Optional[str] = None, **options) -> Dict[str, Any]:
        """options: target, objective ({kind, position, target, foil}), steps, quadrature, layers, heads, tree, ..."""
        return self._request("POST", "/v1/attribution",
                             {**self._body(model=model), **self._text_fields(text), **options})

    def token_identity(self, text, model: Optional[str] = None, **options) -> Dict[str, Any]:
        return self._request("POST", "/v1/token-identity",
                             {**self._body(model=model), **self._text_fields(text), **options})

    def hidden_attribution(self, text, model: Optional[str] = None, **options) -> Dict[str, Any]:
        return self._request("POST", "/v1/hidden-attribution",
                             {**self._body(model=model), **self._text_fields(text), **options})

    def context_mixing(self, text, method: str, model: Optional[str] = None, **options) -> Dict[str, Any]:
        """method: rollout, alti, globenc, value-zeroing, decompx (on a classifier the answer's "classifier" holds
        each token's part of each logit); options: layers, definition, format, text_pair."""
        return self._request("POST", "/v1/context-mixing",
                             {**self._body(model=model), **self._text_fields(text), "method": method, **options})

    def context_mixing_job(self, texts: Optional[Sequence[str]] = None, data: Optional[str] = None,
                           model: Optional[str] = None, progress: Optional[Callable[["Job"], Any]] = None,
                           **options) -> Dict[str, Any]:
        """Job context-mixing over texts (or data, a file in the server's --data-dir): per method and
        layer the mean self and first-token shares of the layer's and the rolled-out matrices.
        options: methods, definition, max_texts. Returns the job's result; raises LensdError when it failed."""
        params = {**self._body(model=model, data=data), **options}
        if texts is not None:
            params["texts"] = list(texts)
        return self.run_job("context-mixing", params, progress=progress).result

    def logit_attribution(self, text, target, model: Optional[str] = None, **options) -> Dict[str, Any]:
        """target: a token id or a one-token text; options: foil, position."""
        return self._request("POST", "/v1/logit-attribution",
                             {**self._body(model=model), **self._text_fields(text), "target": target, **options})

    def ablation(self, text, heads=(), mlps=(), mode: str = "zero", model: Optional[str] = None,
                 **options) -> Dict[str, Any]:
        """heads: [layer, head] pairs (layers from 1), mlps: layers; mode zero or mean;
        options: reference_texts, objective, include_logits, text_pair."""
        body = {**self._body(model=model), **self._text_fields(text), "mode": mode, **options}
        if heads:
            body["heads"] = [list(h) for h in heads]
        if mlps:
            body["mlps"] = list(mlps)
        return self._request("POST", "/v1/ablation", body)

    def patching(self, clean, corrupt, targets=("resid",), method: str = "exact", per_position: bool = False,
                 model: Optional[str] = None, **options) -> Dict[str, Any]:
        """clean, corrupt: texts or token id lists of equal token length; targets: any of resid, heads, mlps;
        method: exact, attribution (attribution patching's grids, under "attribution") or both;
        per_position: heads_pos and mlps_pos too; options: objective."""
        body = {**self._body(model=model), "clean": clean, "corrupt": corrupt, "targets": list(targets),
                "method": method, **options}
        if per_position:
            body["per_position"] = True
        return self._request("POST", "/v1/patching", body)

    def faithfulness(self, texts: Optional[Sequence[str]] = None, model: Optional[str] = None,
                     unit: Optional[str] = None, progress: Optional[Callable[["Job"], Any]] = None,
                     **options) -> Dict[str, Any]:
        """Job faithfulness (docs/faithfulness.md) run to its end: the table of deletion /
        insertion AOPC, comprehensiveness and sufficiency per method and the curves.
        texts, or options data (a TSV under --data-dir) and max_rows; unit "tokens" (the
        server's default) or "heads" (zero-ablate the top heads: methods random,
        attention-attribution, logit-attribution); options: methods, fractions, objective,
        steps, seed, random_orderings."""
        params = {**self._body(model=model), **options}
        if texts is not None:
            params["texts"] = list(texts)
        if unit is not None:
            params["unit"] = unit
        return self.run_job("faithfulness", params, progress=progress).result

    def decomposition(self, model: Optional[str] = None, **options) -> Dict[str, Any]:
        """options: texts (windows) or corpus, length, layers, ... (see DecompositionRequest)."""
        return self._request("POST", "/v1/decomposition", {**self._body(model=model), **options})

    # ----------------------------------------------------------------- jobs

    def submit_job(self, kind: str, params: Dict[str, Any]) -> Job:
        return _build(Job, self._request("POST", "/v1/jobs", {"kind": kind, "params": params}))

    def job(self, id: str) -> Job:
        return _build(Job, self._request("GET", f"/v1/jobs/{urllib.parse.quote(id)}"))

    def cancel_job(self, id: str) -> Job:
        return _build(Job, self._request("DELETE", f"/v1/jobs/{urllib.parse.quote(id)}"))

    def jobs(self, state: Optional[str] = None, limit: Optional[int] = None) -> JobList:
        d = self._request("GET", "/v1/jobs", query={"state": state, "limit": limit})
        return JobList([_build(Job, j) for j in d["jobs"]], d["total"])

    def job_events(self, id: str) -> Iterator[tuple]:
        """(event, Job) pairs from GET /v1/jobs/{id}/events until the job finishes."""
        req = urllib.request.Request(f"{self.base_url}/v1/jobs/{urllib.parse.quote(id)}/events")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            resp = urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            raise self._error(e) from None
        except (urllib.error.URLError, OSError) as e:
            raise LensdUnreachable(self.base_url, str(getattr(e, "reason", e))) from None
        with resp:
            event = None
            for raw in resp:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data = json.loads(line[6:])
                    yield event, (_build(Job, data) if event != "error" else data)

    def run_job(self, kind: str, params: Dict[str, Any], progress: Optional[Callable[[Job], Any]] = None,
                cancel: Optional[Callable[[], bool]] = None) -> Job:
        """Submit a job and follow its events until it finishes. progress(job) is
        called on each event; when cancel() returns True the job is cancelled.
        Returns the final Job; raises LensdError when it failed."""
        job = self.submit_job(kind, params)
        for _event, update in self.job_events(job.id):
            if not isinstance(update, Job):
                raise LensdError(404, update.get("code", "job_not_found"), update.get("message", ""), "id")
            job = update
            if progress:
                progress(job)
            if cancel and not job.finished_state and cancel():
                self.cancel_job(job.id)
        while not job.finished_state:  # the stream closed early (server shutdown): poll
            time.sleep(0.2)
            job = self.job(job.id)
        if job.state == "failed" and job.error:
            raise LensdError(422, job.error.get("code", "failed"), job.error.get("message", ""), job.error.get("field"))
        return job
