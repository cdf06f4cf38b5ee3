// The shapes the HTTP API speaks (docs/http-api.md), and what a Turn hands
// on (its events), as JSDoc types.
//
// Nothing here runs: the module only names types, so that the other modules
// and users of the package (through types/types.d.ts) agree on them.

/**
 * One message of a conversation. A bot message is cumulative: each one a turn
 * streams holds the whole answer so far, so the newest one replaces the last.
 * @typedef {object} ChatMessage
 * @property {"user" | "bot"} sender
 * @property {string} [content]
 * @property {ContentPart[] | null} [content_parts]
 * @property {string | null} [message_id]
 * @property {string | null} [session_id]
 * @property {{name: string, params?: Record<string, unknown>} | null} [function_call_request]
 * @property {{name: string, response?: unknown} | null} [function_call_response]
 * @property {Record<string, unknown> | null} [custom_input]
 * @property {QueuedMark | null} [queued]  set on a user message waiting in the
 *   conversation's queue (its `message_id` is then `<turn>-queued`); gone once its turn starts
 */

/**
 * The mark of a user message waiting in its conversation's queue
 * (`multitaskStrategy: "enqueue"`): the turn it will start, in arrival order.
 * @typedef {object} QueuedMark
 * @property {string} message_id  the id of the turn it will start
 * @property {string} agent_identifier
 * @property {string} enqueued_at
 */

/**
 * A part of a message beside its text: a tool call, a table, or context for the client.
 * @typedef {object} ContentPart
 * @property {"text" | "tool" | "table" | "context"} type
 * @property {string | null} [text]
 * @property {ToolCall | null} [tool]
 * @property {{headers?: string[], rows?: unknown[][]} | null} [table]
 * @property {Record<string, unknown> | null} [context]
 */

/**
 * A tool call as the user sees it: running, then completed or error.
 * @typedef {object} ToolCall
 * @property {string} tool_call_id
 * @property {string} name
 * @property {Record<string, unknown>} [params]
 * @property {unknown} [response]
 * @property {"running" | "completed" | "error"} [status]
 */

/**
 * What the client asks for a new turn. Only `agent` and the user's words are needed.
 * @typedef {object} TurnRequest
 * @property {string} agent  the `agent_identifier` of a set-up agent
 * @property {string} [content]  the user's new message (or give `conversation`)
 * @property {ChatMessage[]} [conversation]  messages to send; the last must be the user's.
 *   With a conversation store the server keeps the transcript, so the new message is enough.
 * @property {string} [sessionId]  the conversation; a new one (a random id) when left out
 * @property {boolean} [stateful]  default true: a stateful turn is checkpointed, so it
 *   can be resumed on another replica when its own dies
 * @property {Record<string, unknown>} [botParams]
 * @property {Record<string, unknown>} [conversationContext]
 * @property {MultitaskStrategy} [multitaskStrategy]  when another turn occupies the
 *   conversation; default `reject`
 */

/**
 * What a new turn does when another turn occupies its conversation:
 * `reject` (ConversationBusyError), `enqueue` (wait, and run after the turns
 * before it: `turn.queued`, `turn.queuePosition`), `interrupt` (cancel it, its
 * partial answer kept, and start at once) or `rollback` (interrupt, and
 * remove the interrupted turn from the transcript).
 * @typedef {"reject" | "enqueue" | "interrupt" | "rollback"} MultitaskStrategy
 */

/**
 * Which turn occupies a conversation (`GET /chat/stream/status`).
 * @typedef {object} TurnStatus
 * @property {string} session_id
 * @property {string} message_id
 * @property {"running" | "done" | "errored" | "cancelled" | "dead"} status
 * @property {number} epoch
 * @property {string | null} [heartbeat_at]
 * @property {QueuedMessage[]} [queue]  the turns waiting after it, in the order they will run
 */

/**
 * A message waiting in a conversation's queue, as the status lists it.
 * @typedef {object} QueuedMessage
 * @property {string} message_id  the id of the turn it will start
 * @property {string} enqueued_at
 * @property {string} content
 */

/**
 * A conversation as listed: ids, owner, sharing and the last turn's status.
 * @typedef {object} ConversationSummary
 * @property {string} tenant
 * @property {string} session_id
 * @property {string} owner_uuid
 * @property {string} agent_identifier
 * @property {boolean} shared
 * @property {"running" | "complete" | "errored" | "cancelled" | null} [last_turn_status]
 * @property {string} created_at
 * @property {string} updated_at
 * @property {number} message_count
 * @property {string} title
 */

/**
 * One page of `GET /conversations`, newest first.
 * @typedef {object} ConversationPage
 * @property {ConversationSummary[]} items
 * @property {string | null} [next_cursor]  pass as `cursor` for the next page
 */

/**
 * A conversation and its transcript (`GET /conversations/{session_id}`).
 * @typedef {object} Conversation
 * @property {ConversationSummary} conversation
 * @property {ChatMessage[]} messages
 */

/**
 * An error the turn ended with, after its stream started (`event: error`).
 * @typedef {object} StreamFailure
 * @property {string} code  such as `INTERNAL`, `TURN_TIMEOUT`, `TAKEOVER_LIMIT`
 * @property {string} message
 */

/**
 * How a turn ended, as far as this client can tell: `done`, `errored` and
 * `cancelled` are the server's verdicts (a queued turn that left the queue
 * without starting ends `cancelled`); `none`: the conversation has no turn
 * to follow; `unknown`: the turn is over but its verdict is no longer kept
 * (its status rows are removed a grace period after it ends, or a newer turn
 * holds the conversation): read the conversation.
 * @typedef {"done" | "errored" | "cancelled" | "none" | "unknown"} EndReason
 */

/**
 * Why the client is recovering: `disconnected` (the stream broke or went
 * silent), `unreachable` (no replica answered), `unavailable` (503: draining,
 * a store unavailable; or a proxy's 502, 504), `dead` (the producer stopped),
 * `gone` (another producer carries the turn now), `interrupted` (the stream
 * ended without a verdict, or with a passing error), `refused` (an attach or
 * resume was refused because the turn changed meanwhile).
 * @typedef {"disconnected" | "unreachable" | "unavailable" | "dead" | "gone"
 *   | "interrupted" | "refused"} RecoveryCause
 */

/**
 * What happens to a turn, in order.
 * - `turn`: the turn followed is known (or, for `follow`, found);
 * - `stream`: a stream of it is open: the one that started it, an attach, or
 *   this client's resume of a dead turn;
 * - `queued`: it waits in the conversation's queue (`enqueue`), at `position`
 *   (1: next); its messages come once it starts;
 * - `message`: the answer so far (cumulative), with its stream id and index
 *   (both null for a final message read from the transcript);
 * - `dropped`: an update not shown, for its text does not extend the answer
 *   shown so far (`shown`): shorter, or other text (counted in `Turn.dropped`);
 * - `recovering`: the stream is over without a verdict; the client looks again;
 * - `end`: the last event.
 * @typedef {{type: "turn", messageId: string}
 *   | {type: "stream", via: "start" | "attach" | "resume", url: string}
 *   | {type: "queued", messageId: string, position: number | null}
 *   | {type: "message", message: ChatMessage, eventId: string | null, index: number | null}
 *   | {type: "dropped", message: ChatMessage, shown: ChatMessage, eventId: string,
 *       index: number}
 *   | {type: "recovering", cause: RecoveryCause, error: unknown}
 *   | {type: "end", reason: EndReason, error: StreamFailure | null}} TurnEvent
 */

export {};
