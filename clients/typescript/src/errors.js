// Everything this client throws: one class per HTTP status the API answers,
// and the ways a streamed turn can end badly.
//
// The server says why in a stable `code` ("CONVERSATION_BUSY", "UNKNOWN_AGENT",
// ...), so a caller can match on the class for the kind of refusal and on
// `code` for the exact one. `errorFromResponse` is the one place a status
// becomes a class. The names are those of the Python client
// (`tether.client.errors`), so both read alike.

/** Anything this client throws. */
export class TetherError extends Error {
  /**
   * @param {string} message
   * @param {{cause?: unknown}} [options]
   */
  constructor(message, options) {
    super(message, options);
    this.name = new.target.name;
  }
}

/**
 * No replica answered at all (refused, reset, timed out). `maybeStarted`:
 * the request may have reached a server before the connection failed.
 */
export class ConnectionFailedError extends TetherError {
  /**
   * @param {string} message
   * @param {{cause?: unknown, maybeStarted?: boolean}} [options]
   */
  constructor(message, options = {}) {
    super(message, { cause: options.cause });
    /** @readonly */
    this.maybeStarted = options.maybeStarted ?? false;
  }
}

/**
 * The server (or a proxy in front of it) answered with an error status:
 * `status`, the server's `code` and `message`, and the whole `body` (parsed
 * when it was JSON, else its text).
 */
export class TetherHttpError extends TetherError {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} message
   * @param {{body?: unknown, retryAfter?: number | null}} [details]
   */
  constructor(status, code, message, details = {}) {
    super(message);
    /** @readonly */
    this.status = status;
    /** @readonly */
    this.code = code;
    /** @readonly */
    this.body = details.body ?? null;
    /** Seconds the server asked to wait (`Retry-After`), if it said. @readonly */
    this.retryAfter = details.retryAfter ?? null;
  }
}

/**
 * `TetherHttpError` under the Python client's name (`tether.client.TetherHTTPError`):
 * the same class, so either name catches every HTTP error.
 */
export { TetherHttpError as TetherHTTPError };

/**
 * 400: a request the server will not run (`AGENTS_STORAGE_NOT_CONFIGURED`,
 * `BOT_PARAMS_REJECTED`, `INVALID_IDENTITY`, `BAD_REQUEST`).
 */
export class BadRequestError extends TetherHttpError {}

/** 401: no token, or one that does not verify (`UNAUTHENTICATED`). */
export class AuthenticationError extends TetherHttpError {}

/**
 * 403: not the conversation's owner (`CONVERSATION_NOT_OWNED`) or a tenant
 * the identity does not name (`TENANT_NOT_ALLOWED`).
 */
export class PermissionDeniedError extends TetherHttpError {}

/** 404: no such agent (`UNKNOWN_AGENT`), turn (`TURN_NOT_FOUND`) or conversation. */
export class NotFoundError extends TetherHttpError {}

/** 409: the request conflicts with the conversation's current state. */
export class ConflictError extends TetherHttpError {}

/**
 * 409 `CONVERSATION_BUSY`: another turn occupies the conversation (a new
 * turn, a resume of a live turn, a delete while a turn runs). `occupant` is
 * that turn's message id: follow it (`client.follow(sessionId)`) or cancel it.
 */
export class ConversationBusyError extends ConflictError {
  /**
   * @param {number} status
   * @param {string} code
   * @param {string} message
   * @param {{body?: unknown, retryAfter?: number | null}} [details]
   */
  constructor(status, code, message, details = {}) {
    super(status, code, message, details);
    const body = isRecord(details.body) ? details.body : {};
    const detail = isRecord(body.detail) ? body.detail : {};
    /** @readonly @type {string | null} */
    this.occupant = text(detail.message_id) ?? text(body.message_id);
    /** @readonly @type {string | null} */
    this.sessionId = text(detail.session_id);
  }
}

/** 410 `TURN_GONE`: the turn has ended, or a newer turn replaced it. */
export class GoneError extends TetherHttpError {}

/** 413 `BODY_TOO_LARGE`. */
export class PayloadTooLargeError extends TetherHttpError {}

/** 422 (`INVALID_REQUEST`; `VALIDATION_ERROR` from FastAPI's own shape): the body or a parameter is invalid; `message` names the field. */
export class UnprocessableEntityError extends TetherHttpError {}

/** 500: the server failed (`INTERNAL`, `STORE_ERROR`); its log has the rest. */
export class InternalServerError extends TetherHttpError {}

/** 501 `NOT_IMPLEMENTED_BY_STORE`: the server's stores cannot do this. */
export class NotImplementedByServerError extends TetherHttpError {}

/** 502: a proxy in front of the servers got no valid answer from one. */
export class BadGatewayError extends TetherHttpError {}

/**
 * 503: a replica that is draining (`DRAINING`), a store that cannot be
 * reached (`STORE_UNAVAILABLE`), or a proxy with no server to send to.
 * Worth retrying, elsewhere or after `retryAfter`.
 */
export class ServiceUnavailableError extends TetherHttpError {}

/** 504: a proxy in front of the servers gave up waiting for one. */
export class GatewayTimeoutError extends TetherHttpError {}

/** A streamed turn could not be read to its end. */
export class StreamError extends TetherError {}

/**
 * The turn ended `errored`: the server's `event: error` said why (`code`
 * such as `INTERNAL`, `TURN_TIMEOUT`, `TAKEOVER_LIMIT`).
 */
export class TurnFailedError extends StreamError {
  /**
   * @param {string} code
   * @param {string} message
   * @param {string | null} messageId
   */
  constructor(code, message, messageId) {
    super(`the turn failed: ${code}: ${message}`);
    /** @readonly */
    this.code = code;
    /** @readonly */
    this.messageId = messageId;
  }
}

/**
 * The client lost its turn's stream and could not get it back: no replica
 * carried it on within the recovery bound (`recoveryTimeoutMs`).
 */
export class RecoveryError extends StreamError {
  /**
   * @param {string} message
   * @param {string | null} messageId
   */
  constructor(message, messageId) {
    super(message);
    /** @readonly */
    this.messageId = messageId;
  }
}

/**
 * A new turn's request was lost on the way, and the conversation's current
 * turn cannot be told to be this client's: it may or may not have started.
 */
export class TurnOutcomeUnknownError extends StreamError {}

/** @type {Record<number, typeof TetherHttpError>} */
const BY_STATUS = {
  400: BadRequestError,
  401: AuthenticationError,
  403: PermissionDeniedError,
  404: NotFoundError,
  409: ConflictError,
  410: GoneError,
  413: PayloadTooLargeError,
  422: UnprocessableEntityError,
  500: InternalServerError,
  501: NotImplementedByServerError,
  502: BadGatewayError,
  503: ServiceUnavailableError,
  504: GatewayTimeoutError,
};

/**
 * The typed error for an error response, from either body shape the server
 * uses (`{"code", "message"}`, or FastAPI's `{"detail": [...]}` for a 422) or
 * from a proxy's page. A status without a class of its own is a TetherHttpError.
 * @param {Response} response
 * @returns {Promise<TetherHttpError>}
 */
export async function errorFromResponse(response) {
  const status = response.status;
  const raw = await response.text().catch(() => "");
  /** @type {unknown} */
  let body = raw;
  try {
    body = raw ? JSON.parse(raw) : null;
  } catch {
    // Not JSON (a proxy's error page): keep the text.
  }
  const [code, message] = codeAndMessage(status, body, raw);
  let Class = BY_STATUS[status] ?? TetherHttpError;
  if (status === 409 && code === "CONVERSATION_BUSY") Class = ConversationBusyError;
  return new Class(status, code, message, { body, retryAfter: retryAfter(response) });
}

/**
 * @param {number} status
 * @param {unknown} body
 * @param {string} raw
 * @returns {[string, string]}
 */
function codeAndMessage(status, body, raw) {
  if (isRecord(body)) {
    const detail = body.detail;
    if (typeof body.code === "string") {
      return [body.code, String(body.message || (typeof detail === "string" ? detail : ""))];
    }
    if (Array.isArray(detail)) {
      // FastAPI's 422: one entry per invalid field.
      return ["VALIDATION_ERROR", detail.map(problem).join("; ")];
    }
    if (detail !== undefined && detail !== null) return [`HTTP_${status}`, String(detail)];
  }
  // Not ours: a proxy's error page, or an empty body.
  return [`HTTP_${status}`, raw.trim().split(/\r?\n/, 1)[0]?.slice(0, 200) ?? ""];
}

/** @param {unknown} item */
function problem(item) {
  if (!isRecord(item)) return String(item);
  const where = Array.isArray(item.loc) ? item.loc.join(".") : "";
  return `${where}: ${String(item.msg ?? JSON.stringify(item))}`;
}

/** @param {Response} response */
function retryAfter(response) {
  const value = response.headers.get("Retry-After");
  const seconds = value === null ? NaN : Number(value);
  return Number.isFinite(seconds) && seconds >= 0 ? seconds : null;
}

/**
 * @param {unknown} value
 * @returns {value is Record<string, unknown>}
 */
function isRecord(value) {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** @param {unknown} value */
function text(value) {
  return typeof value === "string" && value !== "" ? value : null;
}
