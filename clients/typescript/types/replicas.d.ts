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
    constructor(options: ReplicaOptions);
    /** @readonly */
    readonly urls: string[];
    options: ReplicaOptions;
    position: number;
    fetch: typeof fetch;
    /** The replica asked first. */
    get current(): string;
    /**
     * Prefer the replica after `url` from now on (`url` failed).
     * @param {string} url
     */
    skip(url: string): void;
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
    send(url: string, method: string, path: string, options?: RequestOptions): Promise<Response>;
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
    request(method: string, path: string, options?: RequestOptions & {
        onlyIfRefused?: boolean;
    }): Promise<Answer>;
    /**
     * `request`, then the JSON body (null for 204).
     * @param {string} method
     * @param {string} path
     * @param {RequestOptions} [options]
     * @returns {Promise<any>}
     */
    json(method: string, path: string, options?: RequestOptions): Promise<any>;
    #private;
}
export type ReplicaOptions = {
    /**
     * one URL (a load balancer) or one per replica
     */
    urls: string | string[];
    /**
     * sent as `?tenant=` on every request
     */
    tenant: string | (() => string);
    /**
     * sent as `requester-uuid` (behind a gateway that sets identity headers)
     */
    user?: string | undefined;
    /**
     * sent as `Authorization: Bearer` (servers run with `--auth jwt`)
     */
    token?: string | undefined;
    /**
     * more headers;
     * a function is asked before every request (an identity that can change)
     */
    headers?: Record<string, string> | (() => Record<string, string>) | undefined;
    /**
     * default: the global fetch
     */
    fetch?: typeof fetch | undefined;
    /**
     * a replica that sends no answer (headers) for this long
     * counts as unreachable; default 30 000
     */
    requestTimeoutMs?: number | undefined;
};
export type RequestOptions = {
    params?: Record<string, string | number | boolean | null | undefined> | undefined;
    /**
     * sent as JSON
     */
    body?: unknown;
    headers?: Record<string, string> | undefined;
    signal?: AbortSignal | undefined;
};
/**
 * A response, and the replica that gave it.
 */
export type Answer = {
    response: Response;
    url: string;
};
