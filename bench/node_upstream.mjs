// The benchmark's upstream as Node's http server answers (Express and the TypeScript MCP servers run on
// it): `Connection: keep-alive` and `Keep-Alive` on every answer. GET /health; POST echoes the body.
//     node bench/node_upstream.mjs PORT
import http from "node:http";

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (chunk) => chunks.push(chunk));
  req.on("end", () => {
    const body = req.url === "/health" ? Buffer.from("ok") : Buffer.concat(chunks);
    res.writeHead(200, { "Content-Type": "application/json", "Content-Length": body.length });
    res.end(body);
  });
});
server.keepAliveTimeout = 60_000; // the proxies' pooled connections outlive a round of other targets
server.listen(Number(process.argv[2]), "127.0.0.1");
