// api.js - the dashboard's only way to the server: the public HTTP API.
//
// URLs are relative ("v1/models"), so the page works at / and under a
// gateway's path prefix (/lensd/ -> /lensd/v1/models). When the server
// answers 401 the user is asked for the API key once; it is kept in
// sessionStorage (this tab only) and sent as Authorization: Bearer.

const KEY = 'lensd.apiKey';

export class ApiError extends Error {
  constructor(status, code, message, field) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field || null;
  }
}

let pendingKey = null; // one dialog at a time, shared by concurrent 401s

function askKey(message) {
  if (pendingKey) return pendingKey;
  const dlg = document.getElementById('key-dialog');
  const input = dlg.querySelector('input');
  dlg.querySelector('.key-message').textContent = message;
  input.value = '';
  pendingKey = new Promise(resolve => {
    dlg.onclose = () => {
      pendingKey = null;
      resolve(dlg.returnValue === 'ok' && input.value.trim() ? input.value.trim() : null);
    };
    dlg.showModal();
    input.focus();
  });
  return pendingKey;
}

export function authHeaders() {
  const key = sessionStorage.getItem(KEY);
  return key ? { Authorization: `Bearer ${key}` } : {};
}

// GET when body is undefined, else POST JSON; method overrides (DELETE).
export async function api(path, body, method) {
  for (let attempt = 0; ; attempt++) {
    const headers = authHeaders();
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, {
      method: method || (body === undefined ? 'GET' : 'POST'),
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = null; }
    if (res.status === 401 && attempt < 3) {
      const key = await askKey(attempt ? 'That key was refused; try again.' : 'This server needs an API key.');
      if (key === null) throw new ApiError(401, 'unauthorized', 'no API key given');
      sessionStorage.setItem(KEY, key);
      continue;
    }
    if (!res.ok) {
      const e = (data && data.error) || {};
      throw new ApiError(res.status, e.code || `http_${res.status}`, e.message || text || res.statusText, e.field);
    }
    return data;
  }
}

// Server-Sent Events over fetch (EventSource cannot send Authorization):
// calls onEvent({event, data}) per event until the stream ends or signal aborts.
export async function sse(path, onEvent, signal) {
  const res = await fetch(path, { headers: { ...authHeaders(), Accept: 'text/event-stream' }, signal });
  if (!res.ok || !res.body) throw new ApiError(res.status, `http_${res.status}`, 'event stream refused');
  const reader = res.body.getReader(), dec = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      let event = 'message', data = '';
      for (const line of block.split('\n')) {
        if (line.startsWith('event:')) event = line.slice(6).trim();
        else if (line.startsWith('data:')) data += line.slice(5).trim();
      }
      if (data) {
        try { onEvent({ event, data: JSON.parse(data) }); } catch { onEvent({ event, data }); }
      }
    }
  }
}
