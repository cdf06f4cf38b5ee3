/**
 * @typedef {object} TurnOptions
 * @property {string} sessionId
 * @property {string | null} [messageId]  the turn to follow; null follows whichever
 *   occupies the conversation
 * @property {string | null} [agent]  needed to resume; looked up in the conversation when not given
 * @property {string | null} [lastEventId]  continue after this event (`<message_id>:<index>`)
 * @property {ChatMessage | null} [shown]  what the caller shows of the turn as of
 *   `lastEventId` (a reloaded page): no update may take text back from it
 * @property {AbortSignal} [signal]  aborting it is `close()`
 * @property {boolean} [recoverable]  default true; false for a turn started with
 *   `stateful: false`, which no status knows and no replica can resume
 */
/**
 * What the status says to do next (`position`: the stream is an attach to a
 * turn waiting in the queue, there).
 * @typedef {{kind: "stream", stream: Stream, position?: number}
 *   | {kind: "end", reason: EndReason}
 *   | {kind: "transcript", reason: EndReason | null, displaced?: boolean}
 *   | {kind: "retry", cause: RecoveryCause, error: unknown}} Step
 */
/**
 * A turn being followed. Read it once: `for await (const message of turn)`
 * for the answer so far, or `turn.events()` for everything that happens.
 */
export class Turn {
    /**
     * @param {TetherClient} client
     * @param {TurnOptions} options
     */
    constructor(client: TetherClient, options: TurnOptions);
    client: TetherClient;
    /** @readonly */
    readonly sessionId: string;
    /** The turn's message id, once known. @type {string | null} */
    messageId: string | null;
    /**
     * The id of the last event handed on: what a reconnect sends as Last-Event-ID.
     * @type {string | null}
     */
    lastEventId: string | null;
    /** The answer so far. @type {ChatMessage | null} */
    message: ChatMessage | null;
    /**
     * Updates not shown because their text does not extend the answer so far
     * (shorter, or other text), and the characters they would have taken back.
     */
    dropped: {
        updates: number;
        characters: number;
    };
    /** The replica of the stream being read. @type {string | null} */
    url: string | null;
    /**
     * Whether the server queued the turn behind others (`enqueue` on a busy
     * conversation) rather than start it at once.
     */
    queued: boolean;
    /**
     * Its place in the conversation's queue (1: next) when the client last
     * heard it waited; null for a turn that never waited.
     * @type {number | null}
     */
    queuePosition: number | null;
    /**
     * How it ended, once it has.
     * @type {{reason: EndReason, error: StreamFailure | null} | null}
     */
    outcome: {
        reason: EndReason;
        error: StreamFailure | null;
    } | null;
    /**
     * The old name of `queuePosition` (the Python client's `queue_position`).
     * @deprecated use `queuePosition`
     * @returns {number | null}
     */
    get position(): number | null;
    /** Whether the turn is no longer read: `close()` was called, or its reading is over. */
    get closed(): boolean;
    /** Stop reading. The turn itself goes on (`cancel()` stops it). */
    close(): void;
    /**
     * Cancel the turn, from whichever replica answers; the partial answer is
     * kept. False when it had already ended.
     * @returns {Promise<boolean>}
     */
    cancel(): Promise<boolean>;
    /**
     * Send the turn (`TetherClient.startTurn` calls it; see start.js): refusals
     * are thrown here, before anything is read.
     * @param {Omit<NewTurn, "sessionId" | "recoverable" | "signal">} request
     */
    start(request: Omit<NewTurn, "sessionId" | "recoverable" | "signal">): Promise<void>;
    /**
     * Read the turn to its end: its final answer (null if it had none); throws
     * TurnFailedError if the turn ends errored.
     * @returns {Promise<ChatMessage | null>}
     */
    answer(): Promise<ChatMessage | null>;
    /**
     * Everything that happens to the turn, until its end (or `close()`).
     * @returns {AsyncGenerator<TurnEvent, void, undefined>}
     */
    events(): AsyncGenerator<TurnEvent, void, undefined>;
    /** The answer so far, message by message; throws TurnFailedError if the turn ends errored. */
    [Symbol.asyncIterator](): AsyncGenerator<ChatMessage, void, unknown>;
    #private;
}
export type TurnOptions = {
    sessionId: string;
    /**
     * the turn to follow; null follows whichever
     * occupies the conversation
     */
    messageId?: string | null | undefined;
    /**
     * needed to resume; looked up in the conversation when not given
     */
    agent?: string | null | undefined;
    /**
     * continue after this event (`<message_id>:<index>`)
     */
    lastEventId?: string | null | undefined;
    /**
     * what the caller shows of the turn as of
     * `lastEventId` (a reloaded page): no update may take text back from it
     */
    shown?: ChatMessage | null | undefined;
    /**
     * aborting it is `close()`
     */
    signal?: AbortSignal | undefined;
    /**
     * default true; false for a turn started with
     * `stateful: false`, which no status knows and no replica can resume
     */
    recoverable?: boolean | undefined;
};
/**
 * What the status says to do next (`position`: the stream is an attach to a
 * turn waiting in the queue, there).
 */
export type Step = {
    kind: "stream";
    stream: Stream;
    position?: number;
} | {
    kind: "end";
    reason: EndReason;
} | {
    kind: "transcript";
    reason: EndReason | null;
    displaced?: boolean;
} | {
    kind: "retry";
    cause: RecoveryCause;
    error: unknown;
};
import type { TetherClient } from "./client.js";
import type { ChatMessage } from "./types.js";
import type { EndReason } from "./types.js";
import type { StreamFailure } from "./types.js";
import type { NewTurn } from "./start.js";
import type { TurnEvent } from "./types.js";
import type { Stream } from "./stream.js";
import type { RecoveryCause } from "./types.js";
