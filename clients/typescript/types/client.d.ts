/** @typedef {{signal?: AbortSignal}} CallOptions */
export class TetherClient {
    /** @param {ClientOptions} options */
    constructor(options: ClientOptions);
    /** Which replica to ask, and asking it. */
    replicas: Replicas;
    /** @readonly */
    readonly recoveryTimeoutMs: number;
    /** @readonly */
    readonly idleTimeoutMs: number;
    /** @readonly */
    readonly retryDelaysMs: number[];
    /** @readonly */
    readonly random: () => number;
    /**
     * Start a turn and hand on its answer as it grows: every message is the
     * whole answer so far. Breaks, dead replicas and takeovers are recovered
     * on the way; a turn that ends errored throws TurnFailedError, one that
     * cannot be recovered RecoveryError.
     * @param {TurnRequest} request
     * @param {CallOptions} [options]
     * @returns {AsyncGenerator<ChatMessage, void, undefined>}
     */
    stream(request: TurnRequest, options?: CallOptions): AsyncGenerator<ChatMessage, void, undefined>;
    /**
     * Start a turn: resolves once a replica accepted it (its message id is
     * then known), with the Turn to read (read it or `close()` it: it holds a
     * connection). Refusals are thrown as their TetherHttpError (a busy
     * conversation: ConversationBusyError, naming its `occupant`). A request
     * whose answer was lost is not sent twice: the status tells whether it
     * started (see `Turn.start`). With `multitaskStrategy: "enqueue"` a busy
     * conversation queues the turn: it resolves at once with `turn.queued` and
     * `turn.queuePosition`, and the turn's messages come once it starts.
     * @param {TurnRequest} request
     * @param {CallOptions} [options]
     * @returns {Promise<Turn>}
     */
    startTurn(request: TurnRequest, options?: CallOptions): Promise<Turn>;
    /**
     * Follow the turn that occupies a conversation (on opening it, after a
     * reload, on a second device): attach to it while it runs, resume it when
     * its producer died, or just hear its verdict when it has ended (`end`
     * with `none` when the conversation has had no turn). Nothing is asked
     * before the Turn is read.
     * @param {string} sessionId
     * @param {{messageId?: string, lastEventId?: string | null, agent?: string,
     *   shown?: ChatMessage | null} & CallOptions} [options]
     *   `messageId`: only that turn; `lastEventId`: continue after it, if it is
     *   an event of the turn found; `shown`: what the caller shows of it as of
     *   `lastEventId` (no update may take text back from it); `agent`: to
     *   resume with (else looked up)
     * @returns {Turn}
     */
    follow(sessionId: string, options?: {
        messageId?: string;
        lastEventId?: string | null;
        agent?: string;
        shown?: ChatMessage | null;
    } & CallOptions): Turn;
    /**
     * Which turn occupies the conversation, and its verdict, with the turns
     * queued after it (`queue`); null when it has had none.
     * @param {string} sessionId
     * @param {CallOptions} [options]
     * @returns {Promise<TurnStatus | null>}
     */
    status(sessionId: string, options?: CallOptions): Promise<TurnStatus | null>;
    /**
     * The status, and the replica that answered it (where to attach or resume).
     * @param {string} sessionId
     * @param {AbortSignal} [signal]
     * @returns {Promise<{status: TurnStatus | null, url: string}>}
     */
    statusAnswer(sessionId: string, signal?: AbortSignal): Promise<{
        status: TurnStatus | null;
        url: string;
    }>;
    /**
     * Cancel turn `messageId` of conversation `sessionId`, from any replica;
     * the partial answer is kept. A queued turn leaves the queue (it never
     * runs). Resolves true when this call cancelled it, false when it had
     * already ended (the server's 410, as the Python client's `cancel`); one
     * that changes hands meanwhile (a takeover) is cancelled with its new owner.
     * @param {string} sessionId
     * @param {string} messageId
     * @param {CallOptions} [options]
     * @returns {Promise<boolean>}
     */
    cancel(sessionId: string, messageId: string, options?: CallOptions): Promise<boolean>;
    /**
     * One page of your own conversations, most recently updated first.
     * @param {{limit?: number, cursor?: string | null} & CallOptions} [options]
     * @returns {Promise<ConversationPage>}
     */
    listConversations(options?: {
        limit?: number;
        cursor?: string | null;
    } & CallOptions): Promise<ConversationPage>;
    /**
     * Every one of your conversations, page after page.
     * @param {{pageSize?: number} & CallOptions} [options]
     * @returns {AsyncGenerator<ConversationSummary, void, undefined>}
     */
    conversations(options?: {
        pageSize?: number;
    } & CallOptions): AsyncGenerator<ConversationSummary, void, undefined>;
    /**
     * A conversation and its transcript: your own, or one shared in the tenant.
     * @param {string} sessionId
     * @param {CallOptions} [options]
     * @returns {Promise<Conversation>}
     */
    getConversation(sessionId: string, options?: CallOptions): Promise<Conversation>;
    /**
     * Share a conversation with the tenant, or make it private again (owner only).
     * @param {string} sessionId
     * @param {boolean} [shared]  default true
     * @param {CallOptions} [options]
     * @returns {Promise<ConversationSummary>}
     */
    shareConversation(sessionId: string, shared?: boolean, options?: CallOptions): Promise<ConversationSummary>;
    /**
     * Delete a conversation and everything it owns (owner only; a
     * ConversationBusyError while a turn runs in it).
     * @param {string} sessionId
     * @param {CallOptions} [options]
     * @returns {Promise<void>}
     */
    deleteConversation(sessionId: string, options?: CallOptions): Promise<void>;
}
export type RecoveryOptions = {
    /**
     * give up (RecoveryTimeoutError) when recovering
     * brings no new message for this long; default 60 000
     */
    recoveryTimeoutMs?: number | undefined;
    /**
     * a stream silent this long is broken (the server
     * pings every 15 s); default 45 000
     */
    idleTimeoutMs?: number | undefined;
    /**
     * pauses between tries that failed in a row;
     * default 100, 250, 500, 1000, 2000 (the last repeats), each drawn between half
     * its value and its value (jitter: clients that failed together spread out)
     */
    retryDelaysMs?: number[] | undefined;
    /**
     * the source of that jitter, numbers in [0, 1);
     * default Math.random (tests inject their own)
     */
    random?: (() => number) | undefined;
};
export type ClientOptions = ReplicaOptions & RecoveryOptions;
export type CallOptions = {
    signal?: AbortSignal;
};
import { Replicas } from "./replicas.js";
import type { TurnRequest } from "./types.js";
import type { ChatMessage } from "./types.js";
import { Turn } from "./turn.js";
import type { TurnStatus } from "./types.js";
import type { ConversationPage } from "./types.js";
import type { ConversationSummary } from "./types.js";
import type { Conversation } from "./types.js";
import type { ReplicaOptions } from "./replicas.js";
