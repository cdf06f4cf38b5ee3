/**
 * The typed error for an error response, from either body shape the server
 * uses (`{"code", "message"}`, or FastAPI's `{"detail": [...]}` for a 422) or
 * from a proxy's page. A status without a class of its own is a TetherHttpError.
 * @param {Response} response
 * @returns {Promise<TetherHttpError>}
 */
export function errorFromResponse(response: Response): Promise<TetherHttpError>;
/** Anything this client throws. */
export class TetherError extends Error {
    /**
     * @param {string} message
     * @param {{cause?: unknown}} [options]
     */
    constructor(message: string, options?: {
        cause?: unknown;
    });
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
    constructor(message: string, options?: {
        cause?: unknown;
        maybeStarted?: boolean;
    });
    /** @readonly */
    readonly maybeStarted: boolean;
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
    constructor(status: number, code: string, message: string, details?: {
        body?: unknown;
        retryAfter?: number | null;
    });
    /** @readonly */
    readonly status: number;
    /** @readonly */
    readonly code: string;
    /** @readonly */
    readonly body: {} | null;
    /** Seconds the server asked to wait (`Retry-After`), if it said. @readonly */
    readonly retryAfter: number | null;
}
export { TetherHttpError as TetherHTTPError };
/**
 * 400: a request the server will not run (`AGENTS_STORAGE_NOT_CONFIGURED`,
 * `BOT_PARAMS_REJECTED`, `INVALID_IDENTITY`, `BAD_REQUEST`).
 */
export class BadRequestError extends TetherHttpError {
}
/** 401: no token, or one that does not verify (`UNAUTHENTICATED`). */
export class AuthenticationError extends TetherHttpError {
}
/**
 * 403: not the conversation's owner (`CONVERSATION_NOT_OWNED`) or a tenant
 * the identity does not name (`TENANT_NOT_ALLOWED`).
 */
export class PermissionDeniedError extends TetherHttpError {
}
/** 404: no such agent (`UNKNOWN_AGENT`), turn (`TURN_NOT_FOUND`) or conversation. */
export class NotFoundError extends TetherHttpError {
}
/** 409: the request conflicts with the conversation's current state. */
export class ConflictError extends TetherHttpError {
}
/**
 * 409 `CONVERSATION_BUSY`: another turn occupies the conversation (a new
 * turn, a resume of a live turn, a delete while a turn runs). `occupant` is
 * that turn's message id: follow it (`client.follow(sessionId)`) or cancel it.
 */
export class ConversationBusyError extends ConflictError {
    /** @readonly @type {string | null} */
    readonly occupant: string | null;
    /** @readonly @type {string | null} */
    readonly sessionId: string | null;
}
/** 410 `TURN_GONE`: the turn has ended, or a newer turn replaced it. */
export class GoneError extends TetherHttpError {
}
/** 413 `BODY_TOO_LARGE`. */
export class PayloadTooLargeError extends TetherHttpError {
}
/** 422 (`INVALID_REQUEST`; `VALIDATION_ERROR` from FastAPI's own shape): the body or a parameter is invalid; `message` names the field. */
export class UnprocessableEntityError extends TetherHttpError {
}
/** 500: the server failed (`INTERNAL`, `STORE_ERROR`); its log has the rest. */
export class InternalServerError extends TetherHttpError {
}
/** 501 `NOT_IMPLEMENTED_BY_STORE`: the server's stores cannot do this. */
export class NotImplementedByServerError extends TetherHttpError {
}
/** 502: a proxy in front of the servers got no valid answer from one. */
export class BadGatewayError extends TetherHttpError {
}
/**
 * 503: a replica that is draining (`DRAINING`), a store that cannot be
 * reached (`STORE_UNAVAILABLE`), or a proxy with no server to send to.
 * Worth retrying, elsewhere or after `retryAfter`.
 */
export class ServiceUnavailableError extends TetherHttpError {
}
/** 504: a proxy in front of the servers gave up waiting for one. */
export class GatewayTimeoutError extends TetherHttpError {
}
/** A streamed turn could not be read to its end. */
export class StreamError extends TetherError {
}
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
    constructor(code: string, message: string, messageId: string | null);
    /** @readonly */
    readonly code: string;
    /** @readonly */
    readonly messageId: string | null;
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
    constructor(message: string, messageId: string | null);
    /** @readonly */
    readonly messageId: string | null;
}
/**
 * A new turn's request was lost on the way, and the conversation's current
 * turn cannot be told to be this client's: it may or may not have started.
 */
export class TurnOutcomeUnknownError extends StreamError {
}
