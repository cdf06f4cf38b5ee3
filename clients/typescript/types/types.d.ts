/**
 * One message of a conversation. A bot message is cumulative: each one a turn
 * streams holds the whole answer so far, so the newest one replaces the last.
 */
export type ChatMessage = {
    sender: "user" | "bot";
    content?: string | undefined;
    content_parts?: ContentPart[] | null | undefined;
    message_id?: string | null | undefined;
    session_id?: string | null | undefined;
    function_call_request?: {
        name: string;
        params?: Record<string, unknown>;
    } | null | undefined;
    function_call_response?: {
        name: string;
        response?: unknown;
    } | null | undefined;
    custom_input?: Record<string, unknown> | null | undefined;
    /**
     * set on a user message waiting in the
     * conversation's queue (its `message_id` is then `<turn>-queued`); gone once its turn starts
     */
    queued?: QueuedMark | null | undefined;
};
/**
 * The mark of a user message waiting in its conversation's queue
 * (`multitaskStrategy: "enqueue"`): the turn it will start, in arrival order.
 */
export type QueuedMark = {
    /**
     * the id of the turn it will start
     */
    message_id: string;
    agent_identifier: string;
    enqueued_at: string;
};
/**
 * A part of a message beside its text: a tool call, a table, or context for the client.
 */
export type ContentPart = {
    type: "text" | "tool" | "table" | "context";
    text?: string | null | undefined;
    tool?: ToolCall | null | undefined;
    table?: {
        headers?: string[];
        rows?: unknown[][];
    } | null | undefined;
    context?: Record<string, unknown> | null | undefined;
};
/**
 * A tool call as the user sees it: running, then completed or error.
 */
export type ToolCall = {
    tool_call_id: string;
    name: string;
    params?: Record<string, unknown> | undefined;
    response?: unknown;
    status?: "running" | "completed" | "error" | undefined;
};
/**
 * What the client asks for a new turn. Only `agent` and the user's words are needed.
 */
export type TurnRequest = {
    /**
     * the `agent_identifier` of a set-up agent
     */
    agent: string;
    /**
     * the user's new message (or give `conversation`)
     */
    content?: string | undefined;
    /**
     * messages to send; the last must be the user's.
     * With a conversation store the server keeps the transcript, so the new message is enough.
     */
    conversation?: ChatMessage[] | undefined;
    /**
     * the conversation; a new one (a random id) when left out
     */
    sessionId?: string | undefined;
    /**
     * default true: a stateful turn is checkpointed, so it
     * can be resumed on another replica when its own dies
     */
    stateful?: boolean | undefined;
    botParams?: Record<string, unknown> | undefined;
    conversationContext?: Record<string, unknown> | undefined;
    /**
     * when another turn occupies the
     * conversation; default `reject`
     */
    multitaskStrategy?: MultitaskStrategy | undefined;
};
/**
 * What a new turn does when another turn occupies its conversation:
 * `reject` (ConversationBusyError), `enqueue` (wait, and run after the turns
 * before it: `turn.queued`, `turn.queuePosition`), `interrupt` (cancel it, its
 * partial answer kept, and start at once) or `rollback` (interrupt, and
 * remove the interrupted turn from the transcript).
 */
export type MultitaskStrategy = "reject" | "enqueue" | "interrupt" | "rollback";
/**
 * Which turn occupies a conversation (`GET /chat/stream/status`).
 */
export type TurnStatus = {
    session_id: string;
    message_id: string;
    status: "running" | "done" | "errored" | "cancelled" | "dead";
    epoch: number;
    heartbeat_at?: string | null | undefined;
    /**
     * the turns waiting after it, in the order they will run
     */
    queue?: QueuedMessage[] | undefined;
};
/**
 * A message waiting in a conversation's queue, as the status lists it.
 */
export type QueuedMessage = {
    /**
     * the id of the turn it will start
     */
    message_id: string;
    enqueued_at: string;
    content: string;
};
/**
 * A conversation as listed: ids, owner, sharing and the last turn's status.
 */
export type ConversationSummary = {
    tenant: string;
    session_id: string;
    owner_uuid: string;
    agent_identifier: string;
    shared: boolean;
    last_turn_status?: "running" | "errored" | "cancelled" | "complete" | null | undefined;
    created_at: string;
    updated_at: string;
    message_count: number;
    title: string;
};
/**
 * One page of `GET /conversations`, newest first.
 */
export type ConversationPage = {
    items: ConversationSummary[];
    /**
     * pass as `cursor` for the next page
     */
    next_cursor?: string | null | undefined;
};
/**
 * A conversation and its transcript (`GET /conversations/{session_id}`).
 */
export type Conversation = {
    conversation: ConversationSummary;
    messages: ChatMessage[];
};
/**
 * An error the turn ended with, after its stream started (`event: error`).
 */
export type StreamFailure = {
    /**
     * such as `INTERNAL`, `TURN_TIMEOUT`, `TAKEOVER_LIMIT`
     */
    code: string;
    message: string;
};
/**
 * How a turn ended, as far as this client can tell: `done`, `errored` and
 * `cancelled` are the server's verdicts (a queued turn that left the queue
 * without starting ends `cancelled`); `none`: the conversation has no turn
 * to follow; `unknown`: the turn is over but its verdict is no longer kept
 * (its status rows are removed a grace period after it ends, or a newer turn
 * holds the conversation): read the conversation.
 */
export type EndReason = "done" | "errored" | "cancelled" | "none" | "unknown";
/**
 * Why the client is recovering: `disconnected` (the stream broke or went
 * silent), `unreachable` (no replica answered), `unavailable` (503: draining,
 * a store unavailable; or a proxy's 502, 504), `dead` (the producer stopped),
 * `gone` (another producer carries the turn now), `interrupted` (the stream
 * ended without a verdict, or with a passing error), `refused` (an attach or
 * resume was refused because the turn changed meanwhile).
 */
export type RecoveryCause = "disconnected" | "unreachable" | "unavailable" | "dead" | "gone" | "interrupted" | "refused";
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
 */
export type TurnEvent = {
    type: "turn";
    messageId: string;
} | {
    type: "stream";
    via: "start" | "attach" | "resume";
    url: string;
} | {
    type: "queued";
    messageId: string;
    position: number | null;
} | {
    type: "message";
    message: ChatMessage;
    eventId: string | null;
    index: number | null;
} | {
    type: "dropped";
    message: ChatMessage;
    shown: ChatMessage;
    eventId: string;
    index: number;
} | {
    type: "recovering";
    cause: RecoveryCause;
    error: unknown;
} | {
    type: "end";
    reason: EndReason;
    error: StreamFailure | null;
};
