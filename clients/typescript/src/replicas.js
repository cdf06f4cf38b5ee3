// Which replica to ask, and asking it: identity, timeouts, and moving on to
// the next URL when one fails.
//
// A client is given one URL (a load balancer) or one per replica. It keeps
// asking the same one while it answers and moves to the next when it cannot
// be reached or cannot serve (503: draining, a store unavailable; 502 and 504
// from a proxy in front). With one URL the load balancer does the moving and
// "the next URL" is the same URL again.

import {
  BadGatewayError,
  ConnectionFailedError,
  errorFromResponse,
  GatewayTimeoutError,
  ServiceUnavailableError,
} from "./errors.js";

/** Connection errors that prove a request never reached the server. */
const REFUSED = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH"]);

/**
 * @typedef {object} ReplicaOptions
 * @property {string | string[]} urls  one URL (a load balancer) or one per replica
 * @property {string | (() => string)} tenant  sent as `?tenant=` on every request
 * @property {string} [user]  sent as `requester-uuid` (behind a gateway that sets identity headers)
 * @property {string} [token]  sent as `Authorization: Bearer` (servers run with `--auth jwt`)
 * @property {Record<string, string> | (() => Record<string, string>)} [headers]  more headers;
 *   a function is asked before every request (an identity that can change)
 * @property {typeof fetch} [fetch]  default: the global fetch
 * @property {number} [requestTimeoutMs]  a replica that sends no answer (headers) for this long
 *   counts as unreachable; default 30 000
 */

/**
 * @typedef {object} RequestOptions
 * @property {Record<string, string | number | boolean | null | undefined>} [params]
 * @property {unknown} [body]  sent as JSON
 * @property {Record<string, string>} [headers]
 * @property {AbortSignal} [signal]
 */

/** A response, and the replica that gave it. @typedef {{response: Response, url: string}} Answer */

export class Replicas {
  /** @param {ReplicaOptions} options */
  constructor(options) {
    const urls = (Array.isArray(options.urls) ? options.urls : [options.urls]).map((url) =>
      url.replace(/\/+$/, ""),
    );
    if (urls.length === 0) throw new TypeError("tether-client: give at least one URL");
    /** @readonly */
    this.urls = urls;
    this.options = options;
    this.position = 0;
    this.fetch = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** The replica asked first. */
  get current() {
    return this.urls[this.position];
  }

  /**
   * Prefer the replica after `url` from now on (`url` failed).
   * @param {string} url
   */
  skip(url) {
    const index = this.urls.indexOf(url);
    if (index === this.position) this.position = (index + 1) % this.urls.length;
  }

  /**
   * One request to one replica. Resolves with the response of any status;
   * rejects with the caller's abort reason, or an ConnectionFailedError when the
   * replica could not be reached or did not answer in time.
   * @param {string} url
   * @param {string} method
   * @param {string} path
   * @param {RequestOptions} [options]
   * @returns {Promise<Response>}
   */
  async send(url, method, path, options = {}) {
    const controller = new AbortController();
    const { signal } = options;
    const abort = () => controller.abort(signal?.reason);
    if (signal?.aborted) abort();
    signal?.addEventListener("abort", abort, { once: true });
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      controller.abort();
    }, this.options.requestTimeoutMs ?? 30_000);
    /** @type {Record<string, string>} */
    const headers = { ...this.#identity(), ...options.headers };
    /** @type {RequestInit} */
    const init = { method, headers, signal: controller.signal };
    if (options.body !== undefined) {
      init.body = JSON.stringify(options.body);
      headers["content-type"] = "application/json";
    }
    try {
      return await this.fetch(this.#address(url, path, options.params), init);
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      const why = timedOut ? "did not answer in time" : "could not be reached";
      throw new ConnectionFailedError(`${url} ${why}`, {
        cause: error,
        maybeStarted: !refused(error),
      });
    } finally {
      // The answer (its headers) is in: a stream's silence is its reader's watchdog's business.
      clearTimeout(timer);
    }
  }

  /**
   * A request that may go to any replica: the current one first, then each
   * other one once, moving on when one cannot be reached or cannot serve.
   * With `onlyIfRefused` (a new turn), only a failure that surely started
   * nothing moves on (refused before it was sent, a 503); one that may have
   * reached a server (a lost answer, a proxy's 502 or 504) is thrown as is.
   * Any other error status is thrown as its TetherHttpError.
   * @param {string} method
   * @param {string} path
   * @param {RequestOptions & {onlyIfRefused?: boolean}} [options]
   * @returns {Promise<Answer>}
   */
  async request(method, path, options = {}) {
    /** @type {unknown} */
    let last = null;
    for (let tried = 0; tried < this.urls.length; tried++) {
      const url = this.current;
      let response;
      try {
        response = await this.send(url, method, path, options);
      } catch (error) {
        if (!(error instanceof ConnectionFailedError)) throw error;
        if (options.onlyIfRefused && error.maybeStarted) throw error;
        last = error;
        this.skip(url);
        continue;
      }
      if (response.ok) return { response, url };
      const error = await errorFromResponse(response);
      const passing =
        error instanceof ServiceUnavailableError ||
        (!options.onlyIfRefused &&
          (error instanceof BadGatewayError || error instanceof GatewayTimeoutError));
      if (!passing) throw error;
      last = error;
      this.skip(url);
    }
    throw last;
  }

  /**
   * `request`, then the JSON body (null for 204).
   * @param {string} method
   * @param {string} path
   * @param {RequestOptions} [options]
   * @returns {Promise<any>}
   */
  async json(method, path, options) {
    const { response } = await this.request(method, path, options);
    return response.status === 204 ? null : response.json();
  }

  /** @returns {Record<string, string>} */
  #identity() {
    const { user, token, headers } = this.options;
    /** @type {Record<string, string>} */
    const identity = {};
    if (user !== undefined) identity["requester-uuid"] = user;
    if (token) identity.Authorization = `Bearer ${token}`;
    return { ...identity, ...(typeof headers === "function" ? headers() : headers) };
  }

  /**
   * @param {string} url
   * @param {string} path
   * @param {RequestOptions["params"]} params
   */
  #address(url, path, params = {}) {
    const tenant = this.options.tenant;
    const query = new URLSearchParams({ tenant: typeof tenant === "function" ? tenant() : tenant });
    for (const [key, value] of Object.entries(params)) {
      if (value !== undefined && value !== null) query.set(key, String(value));
    }
    return `${url}${path}?${query}`;
  }
}

/**
 * Whether a fetch failure proves the request never left: Node names the
 * connection error (undici's `cause.code`); a browser says nothing, so there
 * every failure may have reached the server.
 * @param {unknown} error
 */
function refused(error) {
  for (let link = error, depth = 0; link && depth < 4; depth++) {
    const code = /** @type {{code?: unknown}} */ (link).code;
    if (typeof code === "string" && REFUSED.has(code)) return true;
    link = /** @type {{cause?: unknown}} */ (link).cause;
  }
  return false;
}
