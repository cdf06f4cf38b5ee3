// A load balancer in front of the replicas, for the tests: the front end
// knows one URL, as it does behind HAProxy or nginx.
//
// Each request goes to the preferred replica, or to the next one when that
// one refuses the connection (a killed replica). A response cut by a dying
// replica is cut for the client too, and a client that goes away (the AI
// SDK's stop() aborting its fetch) closes the upstream request, so the
// replica sees what it would see behind a real proxy.

import http from 'node:http';

export class Balancer {
  /** @param {string[]} upstreams base URLs of the replicas */
  constructor(upstreams) {
    this.upstreams = upstreams;
    this.preferred = 0;
    /** Which replica served each request: {method, path, upstream}. */
    this.routes = [];
    this.server = http.createServer((req, res) => this.#handle(req, res));
    // No keep-alive towards the replicas: each request picks its replica.
    this.agent = new http.Agent({ keepAlive: false });
  }

  /** Send the next requests to replica `index` first. */
  prefer(index) {
    this.preferred = index;
  }

  async start() {
    await new Promise((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${this.server.address().port}`;
    return this;
  }

  async close() {
    this.server.closeAllConnections();
    await new Promise((resolve) => this.server.close(resolve));
    this.agent.destroy();
  }

  async #handle(req, res) {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const body = Buffer.concat(chunks);
    const order = this.upstreams.map((_, i) => (this.preferred + i) % this.upstreams.length);
    for (const index of order) {
      if (await this.#forward(index, req, body, res)) {
        this.routes.push({ method: req.method, path: req.url, upstream: index });
        return;
      }
    }
    res.writeHead(502, { 'content-type': 'text/plain' });
    res.end('no replica answered');
  }

  // Resolves true once the replica answered (the response is then piped),
  // false when it could not be reached at all.
  #forward(index, req, body, res) {
    return new Promise((resolve) => {
      let answered = false;
      const upstream = http.request(
        new URL(req.url, this.upstreams[index]),
        { method: req.method, headers: req.headers, agent: this.agent },
        (reply) => {
          answered = true;
          res.writeHead(reply.statusCode, reply.headers);
          reply.pipe(res);
          reply.on('aborted', () => res.destroy());
          reply.on('error', () => res.destroy());
          resolve(true);
        },
      );
      upstream.on('error', () => {
        if (answered) res.destroy();
        else resolve(false);
      });
      res.on('close', () => {
        if (!res.writableFinished) upstream.destroy();
      });
      upstream.end(body);
    });
  }
}
