// The client: turns (start, follow, cancel) and conversations (list, read,
// share, delete), over one load-balanced URL or several replicas.

import { ConversationBusyError, GoneError, NotFoundError, TetherError } from "./errors.js";
import { Replicas } from "./replicas.js";
import { pause } from "./retry.js";
import { Turn } from "./turn.js";

/**
 * @import { ChatMessage, Conversation, ConversationPage, ConversationSummary } from "./types.js"
 * @import { TurnRequest, TurnStatus } from "./types.js"
 */
/** @import { ReplicaOptions } from "./replicas.js" */

/**
 * @typedef {object} RecoveryOptions
 * @property {number} [recoveryTimeoutMs]  give up (RecoveryTimeoutError) when recovering
 *   brings no new message for this long; default 60 000
 * @property {number} [idleTimeoutMs]  a stream silent this long is broken (the server
 *   pings every 15 s); default 45 000
 * @property {number[]} [retryDelaysMs]  pauses between tries that failed in a row;
 *   default 100, 250, 500, 1000, 2000 (the last repeats), each drawn between half
 *   its value and its value (jitter: clients that failed together spread out)
 * @property {() => number} [random]  the source of that jitter, numbers in [0, 1);
 *   default Math.random (tests inject their own)
 */

/** @typedef {ReplicaOptions & RecoveryOptions} ClientOptions */

/** Tries of a cancel that keeps meeting a turn changing hands. */
const CANCEL_TRIES = 5;

/** @typedef {{signal?: AbortSignal}} CallOptions */

export class TetherClient {
  /** @param {ClientOptions} options */
  constructor(options) {
    /** Which replica to ask, and asking it. */
    this.replicas = new Replicas(options);
    /** @readonly */
    this.recoveryTimeoutMs = options.recoveryTimeoutMs ?? 60_000;
    /** @readonly */
    this.idleTimeoutMs = options.idleTimeoutMs ?? 45_000;
    /** @readonly */
    this.retryDelaysMs = options.retryDelaysMs?.length
      ? options.retryDelaysMs
      : [100, 250, 500, 1000, 2000];
    /** @readonly */
    this.random = options.random ?? Math.random;
  }

  // ---------------------------------------------------------------- turns

  /**
   * Start a turn and hand on its answer as it grows: every message is the
   * whole answer so far. Breaks, dead replicas and takeovers are recovered
   * on the way; a turn that ends errored throws TurnFailedError, one that
   * cannot be recovered RecoveryError.
   * @param {TurnRequest} request
   * @param {CallOptions} [options]
   * @returns {AsyncGenerator<ChatMessage, void, undefined>}
   */
  async *stream(request, options) {
    yield* await this.startTurn(request, options);
  }

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
  async startTurn(request, options = {}) {
    const sessionId = request.sessionId ?? randomId();
    /** @type {ChatMessage[]} */
    const conversation =
      request.conversation ??
      (request.content === undefined ? [] : [{ sender: "user", content: request.content }]);
    const stateful = request.stateful ?? true;
    const turn = new Turn(this, {
      sessionId,
      agent: request.agent,
      signal: options.signal,
      recoverable: stateful,
    });
    const last = conversation.at(-1);
    const strategy = request.multitaskStrategy ?? "reject";
    await turn.start({
      body: {
        agent_identifier: request.agent,
        conversation,
        stateful,
        session_id: sessionId,
        bot_params: request.botParams,
        conversation_context: request.conversationContext,
        // The default is the server's: left out, for servers that predate it.
        multitask_strategy: strategy === "reject" ? undefined : strategy,
      },
      ownSession: request.sessionId === undefined,
      content: last?.sender === "user" ? (last.content ?? "") : null,
      enqueue: strategy === "enqueue",
    });
    return turn;
  }

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
  follow(sessionId, options = {}) {
    return new Turn(this, { sessionId, ...options });
  }

  /**
   * Which turn occupies the conversation, and its verdict, with the turns
   * queued after it (`queue`); null when it has had none.
   * @param {string} sessionId
   * @param {CallOptions} [options]
   * @returns {Promise<TurnStatus | null>}
   */
  async status(sessionId, options) {
    return (await this.statusAnswer(sessionId, options?.signal)).status;
  }

  /**
   * The status, and the replica that answered it (where to attach or resume).
   * @param {string} sessionId
   * @param {AbortSignal} [signal]
   * @returns {Promise<{status: TurnStatus | null, url: string}>}
   */
  async statusAnswer(sessionId, signal) {
    const url = this.replicas.current;
    try {
      const answer = await this.replicas.request("GET", "/chat/stream/status", {
        params: { session_id: sessionId },
        signal,
      });
      return { status: await answer.response.json(), url: answer.url };
    } catch (error) {
      // Tether's own 404 (not a proxy's page for a path it does not know).
      if (error instanceof NotFoundError && error.code === "TURN_NOT_FOUND") {
        return { status: null, url };
      }
      throw error;
    }
  }

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
  async cancel(sessionId, messageId, options) {
    const signal = options?.signal ?? new AbortController().signal;
    for (let failures = 0; ; failures++) {
      try {
        await this.replicas.request("DELETE", `/chat/stream/${encodeURIComponent(messageId)}`, {
          params: { session_id: sessionId },
          signal,
        });
        return true;
      } catch (error) {
        if (error instanceof GoneError) return false;
        // The turn changed hands (a takeover) while the cancel was granted:
        // the server asks to try again, and the next try meets the new owner.
        const raced = error instanceof ConversationBusyError && error.occupant === messageId;
        if (!raced || failures >= CANCEL_TRIES) throw error;
        await pause(error, failures, this.retryDelaysMs, signal, this.random);
      }
    }
  }

  // -------------------------------------------------------- conversations

  /**
   * One page of your own conversations, most recently updated first.
   * @param {{limit?: number, cursor?: string | null} & CallOptions} [options]
   * @returns {Promise<ConversationPage>}
   */
  listConversations(options = {}) {
    return this.replicas.json("GET", "/conversations", {
      params: { limit: options.limit, cursor: options.cursor },
      signal: options.signal,
    });
  }

  /**
   * Every one of your conversations, page after page.
   * @param {{pageSize?: number} & CallOptions} [options]
   * @returns {AsyncGenerator<ConversationSummary, void, undefined>}
   */
  async *conversations(options = {}) {
    /** @type {string | null | undefined} */
    let cursor = null;
    do {
      const page = await this.listConversations({
        limit: options.pageSize,
        cursor,
        signal: options.signal,
      });
      yield* page.items;
      cursor = page.next_cursor;
    } while (cursor);
  }

  /**
   * A conversation and its transcript: your own, or one shared in the tenant.
   * @param {string} sessionId
   * @param {CallOptions} [options]
   * @returns {Promise<Conversation>}
   */
  getConversation(sessionId, options) {
    return this.replicas.json("GET", `/conversations/${encodeURIComponent(sessionId)}`, options);
  }

  /**
   * Share a conversation with the tenant, or make it private again (owner only).
   * @param {string} sessionId
   * @param {boolean} [shared]  default true
   * @param {CallOptions} [options]
   * @returns {Promise<ConversationSummary>}
   */
  shareConversation(sessionId, shared = true, options = undefined) {
    return this.replicas.json("PATCH", `/conversations/${encodeURIComponent(sessionId)}`, {
      body: { shared },
      signal: options?.signal,
    });
  }

  /**
   * Delete a conversation and everything it owns (owner only; a
   * ConversationBusyError while a turn runs in it).
   * @param {string} sessionId
   * @param {CallOptions} [options]
   * @returns {Promise<void>}
   */
  async deleteConversation(sessionId, options) {
    await this.replicas.request(
      "DELETE",
      `/conversations/${encodeURIComponent(sessionId)}`,
      options,
    );
  }
}

/**
 * A new conversation's id. crypto.randomUUID needs a secure context, which a
 * page served over plain http is not.
 */
function randomId() {
  const crypto = globalThis.crypto;
  if (typeof crypto?.randomUUID === "function") return crypto.randomUUID();
  if (typeof crypto?.getRandomValues !== "function") {
    throw new TetherError("no crypto.getRandomValues here: pass a sessionId");
  }
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
}
