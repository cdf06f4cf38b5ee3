// A new turn's request, sent once.
//
// A request refused before it was sent (the connection refused, a 503) goes
// to the next replica. One whose answer was lost on the way (a connection
// reset, a proxy's 502 or 504, or a 409 after such a loss) may have started
// the turn, and sending it again could answer the same message twice. So the
// status is asked instead: no turn, send it again; a turn that surely
// answers this message, follow it (with `enqueue`: the last message waiting
// in the status's queue, when it is this one); any other turn,
// TurnOutcomeUnknownError.

import {
  BadGatewayError,
  ConnectionFailedError,
  ConversationBusyError,
  GatewayTimeoutError,
  ServiceUnavailableError,
  TetherHttpError,
  TurnOutcomeUnknownError,
} from "./errors.js";
import { STREAM_MODE } from "./held.js";
import { passing, pause } from "./retry.js";
import { openStream } from "./stream.js";

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
export async function sendTurn(client, turn) {
  const deadline = Date.now() + client.recoveryTimeoutMs;
  let maybeStarted = false;
  let failures = 0;
  for (;;) {
    try {
      const stream = await openStream(
        "start",
        (signal) =>
          client.replicas.request("POST", "/chat/stream", {
            params: { stream_mode: STREAM_MODE },
            body: turn.body,
            signal,
            onlyIfRefused: true,
          }),
        turn.signal,
      );
      return { stream };
    } catch (error) {
      const lost =
        (error instanceof ConnectionFailedError && error.maybeStarted) ||
        error instanceof BadGatewayError ||
        error instanceof GatewayTimeoutError ||
        // Busy after a lost start: possibly with this very turn.
        (error instanceof ConversationBusyError && maybeStarted);
      const refused =
        error instanceof ConnectionFailedError || error instanceof ServiceUnavailableError;
      if (turn.signal.aborted || !(lost || refused) || Date.now() > deadline) throw error;
      // No status knows a stateless turn: a lost one cannot be told from none.
      if (lost && !turn.recoverable) throw error;
      if (lost) {
        maybeStarted = true;
        const adopted = await startedAnyway(client, turn, deadline);
        if (adopted !== null) return adopted;
      }
      await pause(error, failures++, client.retryDelaysMs, turn.signal, client.random);
    }
  }
}

/**
 * A turn a lost request started (`position` null) or queued.
 * @typedef {{adopted: string, position: number | null}} Adopted
 */

/**
 * After a lost answer: the turn it started or queued, or null when the
 * conversation has no turn (nothing started: send it again).
 * @param {TetherClient} client
 * @param {NewTurn} turn
 * @param {number} deadline
 * @returns {Promise<Adopted | null>}
 */
async function startedAnyway(client, turn, deadline) {
  let failures = 0;
  for (;;) {
    let status;
    try {
      status = await client.status(turn.sessionId, { signal: turn.signal });
    } catch (error) {
      if (passing(error) === null || Date.now() > deadline) throw error;
      await pause(error, failures++, client.retryDelaysMs, turn.signal, client.random);
      continue;
    }
    if (status === null) return null;
    const waiting = status.queue ?? [];
    const last = waiting.at(-1);
    if (turn.enqueue && last && (turn.ownSession || last.content === (turn.content ?? ""))) {
      return { adopted: last.message_id, position: waiting.length };
    }
    if (turn.ownSession || (await answers(client, turn, status.message_id))) {
      return { adopted: status.message_id, position: null };
    }
    throw new TurnOutcomeUnknownError(
      `the request for a new turn was lost, and the conversation's turn ` +
        `${status.message_id} cannot be told to answer it`,
    );
  }
}

/**
 * Whether turn `messageId` answers this request: the transcript's last user
 * message is this message, recorded by that turn (as `<message_id>-user`).
 * @param {TetherClient} client
 * @param {NewTurn} turn
 * @param {string} messageId
 */
async function answers(client, turn, messageId) {
  try {
    const { messages } = await client.getConversation(turn.sessionId, { signal: turn.signal });
    const user = messages.findLast((message) => message.sender === "user");
    return (
      user?.message_id === `${messageId}-user` && (user.content ?? "") === (turn.content ?? "")
    );
  } catch (error) {
    if (error instanceof ConnectionFailedError || error instanceof TetherHttpError) return false;
    throw error;
  }
}
