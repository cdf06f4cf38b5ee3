// The HTTP API of design §3, as the page calls it; every refusal becomes words.

/** A request the server refused, or could not be sent; `words` is for people. */
export class ApiError extends Error {
  constructor(status, code, words, body = {}) {
    super(words);
    this.status = status;
    this.code = code;
    this.words = words;
    this.body = body;
  }
}

export class Api {
  /** @param {() => {tenant: string, headers: Record<string, string>}} identity */
  constructor(identity) {
    this.identity = identity;
  }

  url(path, params = {}) {
    const query = new URLSearchParams({ tenant: this.identity().tenant });
    for (const [key, value] of Object.entries(params)) {
      if (value !== undefined && value !== null) query.set(key, String(value));
    }
    return `${path}?${query}`;
  }

  /** fetch() that throws ApiError for anything but 2xx, and for no answer at all. */
  async request(method, path, { params, body, headers = {}, signal } = {}) {
    const init = { method, headers: { ...this.identity().headers, ...headers }, signal };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["content-type"] = "application/json";
    }
    let response;
    try {
      response = await fetch(this.url(path, params), init);
    } catch (error) {
      if (error.name === "AbortError") throw error;
      throw new ApiError(0, "UNREACHABLE", "The server could not be reached. Is it running?");
    }
    if (!response.ok) throw await refusal(response);
    return response;
  }

  async json(method, path, options) {
    const response = await this.request(method, path, options);
    return response.status === 204 ? null : response.json();
  }

  config() {
    return this.json("GET", "/web/config");
  }

  conversations() {
    return this.json("GET", "/conversations", { params: { limit: 100 } });
  }

  conversation(sessionId) {
    return this.json("GET", `/conversations/${encodeURIComponent(sessionId)}`);
  }

  share(sessionId, shared) {
    return this.json("PATCH", `/conversations/${encodeURIComponent(sessionId)}`, {
      body: { shared },
    });
  }

  /** Which turn occupies the conversation, or null when none is known (404). */
  async status(sessionId) {
    try {
      return await this.json("GET", "/chat/stream/status", { params: { session_id: sessionId } });
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) return null;
      throw error;
    }
  }

  /** A new turn: the streaming response (its X-Tether-Message-Id names the turn). */
  startTurn(agent, sessionId, content, signal) {
    return this.request("POST", "/chat/stream", {
      body: {
        agent_identifier: agent,
        stateful: true,
        session_id: sessionId,
        conversation: [{ sender: "user", content }],
      },
      signal,
    });
  }

  /** Take over a turn whose producer died; it continues from its checkpoint. */
  resume(agent, sessionId, messageId, signal) {
    return this.request("POST", "/chat/stream", {
      params: { resume: "true", message_id: messageId },
      body: { agent_identifier: agent, stateful: true, session_id: sessionId, conversation: [] },
      signal,
    });
  }

  /** Attach to a turn, after `lastEventId` when this tab has seen part of it. */
  attach(sessionId, messageId, lastEventId, signal) {
    return this.request("GET", `/chat/stream/${encodeURIComponent(messageId)}`, {
      params: { session_id: sessionId },
      headers: lastEventId ? { "Last-Event-ID": lastEventId } : {},
      signal,
    });
  }

  cancel(sessionId, messageId) {
    return this.json("DELETE", `/chat/stream/${encodeURIComponent(messageId)}`, {
      params: { session_id: sessionId },
    });
  }
}

async function refusal(response) {
  let body = {};
  try {
    body = await response.json();
  } catch {
    // Not JSON (a proxy's error page): the status alone has to do.
  }
  const code = typeof body.code === "string" ? body.code : `HTTP_${response.status}`;
  return new ApiError(response.status, code, describe(response.status, code, body), body);
}

function describe(status, code, body) {
  const said = typeof body.message === "string" ? body.message : "";
  if (status === 401) {
    return `The server did not accept your credentials${said ? `: ${said}` : ""}. Check the access token.`;
  }
  if (status === 422 && Array.isArray(body.detail)) {
    const problems = body.detail.map((item) => {
      const where = Array.isArray(item.loc) ? item.loc.filter((p) => p !== "body").join(".") : "";
      return where ? `${where}: ${item.msg}` : String(item.msg);
    });
    return `The server refused the request: ${problems.join("; ")}.`;
  }
  if (status === 413) return "That message is too long for this server.";
  if (code === "DRAINING") return "This replica is shutting down. Try again in a moment.";
  if (said) return sentence(said);
  if (status >= 500) return `The server failed (HTTP ${status}). Try again.`;
  return `The server refused the request (HTTP ${status}).`;
}

function sentence(text) {
  const capital = text.charAt(0).toUpperCase() + text.slice(1);
  return /[.!?]$/.test(capital) ? capital : `${capital}.`;
}
