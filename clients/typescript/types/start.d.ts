/** @import { TetherClient } from "./client.js" */
/** @import { Stream } from "./stream.js" */
/**
 * @typedef {object} NewTurn
 * @property {string} sessionId
 * @property {Record<string, unknown>} body  the POST /chat/stream body
 * @property {boolean} ownSession  the session id is one this client made up: any turn
 *   in it is this one
 * @property {string | null} content  the user's new message, to know it in the transcript
 * @property {boolean} enqueue  sent with `multitask_strategy: "enqueue"`: it may wait in the queue
 * @property {boolean} recoverable  stateful: a status knows it
 * @property {AbortSignal} signal
 */
/**
 * Send the turn: its stream once a replica accepted it, or, when the answer
 * was lost but the turn surely started (or was queued: `position`), its
 * message id (to follow it through recovery). Refusals are thrown as their
 * TetherHttpError.
 * @param {TetherClient} client
 * @param {NewTurn} turn
 * @returns {Promise<{stream: Stream} | Adopted>}
 */
export function sendTurn(client: TetherClient, turn: NewTurn): Promise<{
    stream: Stream;
} | Adopted>;
export type NewTurn = {
    sessionId: string;
    /**
     * the POST /chat/stream body
     */
    body: Record<string, unknown>;
    /**
     * the session id is one this client made up: any turn
     * in it is this one
     */
    ownSession: boolean;
    /**
     * the user's new message, to know it in the transcript
     */
    content: string | null;
    /**
     * sent with `multitask_strategy: "enqueue"`: it may wait in the queue
     */
    enqueue: boolean;
    /**
     * stateful: a status knows it
     */
    recoverable: boolean;
    signal: AbortSignal;
};
/**
 * A turn a lost request started (`position` null) or queued.
 */
export type Adopted = {
    adopted: string;
    position: number | null;
};
import type { TetherClient } from "./client.js";
import type { Stream } from "./stream.js";
