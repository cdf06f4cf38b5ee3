// A load balancer in front of real replicas, that a test can cut.
//
// Each request goes to the next upstream in turn (round robin), so a client
// given only this URL meets different replicas as a real load balancer would
// send it. `cutAll()` destroys every open connection, clients' and
// upstreams', as a network that drops does; the replicas live on.

import { createServer, request as forward } from "node:http";

/**
 * @param {string[]} upstreams  base URLs of the replicas
 * @returns {Promise<{url: string, cutAll: () => void, close: () => Promise<void>}>}
 */
export async function startBalancer(upstreams) {
  /** @type {Set<import("node:net").Socket>} */
  const sockets = new Set();
  let next = 0;
  const server = createServer((incoming, outgoing) => {
    const target = new URL(incoming.url ?? "/", upstreams[next++ % upstreams.length]);
    const upstream = forward(
      target,
      { method: incoming.method, headers: { ...incoming.headers, host: target.host } },
      (answer) => {
        outgoing.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(outgoing);
      },
    );
    upstream.on("socket", (socket) => track(sockets, socket));
    upstream.on("error", () => outgoing.destroy());
    outgoing.on("close", () => upstream.destroy());
    incoming.pipe(upstream);
  });
  server.on("connection", (socket) => track(sockets, socket));
  await new Promise((resolve) => server.listen(0, "127.0.0.1", () => resolve(undefined)));
  const address = /** @type {import("node:net").AddressInfo} */ (server.address());
  return {
    url: `http://127.0.0.1:${address.port}`,
    cutAll() {
      for (const socket of sockets) socket.destroy();
    },
    close() {
      for (const socket of sockets) socket.destroy();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * @param {Set<import("node:net").Socket>} sockets
 * @param {import("node:net").Socket} socket
 */
function track(sockets, socket) {
  sockets.add(socket);
  socket.on("close", () => sockets.delete(socket));
}
