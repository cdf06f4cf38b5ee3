/**
 * One event of the stream.
 * @typedef {object} SseEvent
 * @property {string} event  the `event:` field, `message` when there was none
 * @property {string} id  the last `id:` field seen so far (the spec's "last event ID")
 * @property {string} data  the `data:` lines, joined by newlines
 */
/**
 * The events of an SSE body, in order. Ends when the body ends; throws when
 * the connection breaks. A reader that stops early (a `break`, a `return`)
 * cancels the body, which closes the connection.
 * @param {ReadableStream<Uint8Array>} body
 * @param {{onBytes?: () => void}} [options]  `onBytes` hears every chunk, keep-alive
 *   comments included: a watchdog's sign of life
 * @returns {AsyncGenerator<SseEvent, void, undefined>}
 */
export function readEvents(body: ReadableStream<Uint8Array>, options?: {
    onBytes?: () => void;
}): AsyncGenerator<SseEvent, void, undefined>;
/**
 * One event of the stream.
 */
export type SseEvent = {
    /**
     * the `event:` field, `message` when there was none
     */
    event: string;
    /**
     * the last `id:` field seen so far (the spec's "last event ID")
     */
    id: string;
    /**
     * the `data:` lines, joined by newlines
     */
    data: string;
};
