// Drives a Toxiproxy API (real Toxiproxy, or chaosproxy's) with Toxiproxy's own Node client, and observes
// each step's effect with a real HTTP client (node:http) through the proxy. Prints one JSON object.
//   node drive.js API_URL UPSTREAM_HOST:PORT        (tests/test_toxiproxy_api.py runs it)
"use strict";
const http = require("node:http");
const { Toxiproxy } = require("toxiproxy-node-client");

const [api, upstream] = process.argv.slice(2);

function get(listen) {  // {status, ms} or {error, ms}; a new connection each time, 5 s at most
  const [host, port] = [listen.slice(0, listen.lastIndexOf(":")), listen.slice(listen.lastIndexOf(":") + 1)];
  const start = Date.now();
  return new Promise((resolve) => {
    const request = http.get({ host, port, path: "/health", agent: false, timeout: 5000 }, (response) => {
      response.resume();
      response.on("end", () => resolve({ status: response.statusCode, ms: Date.now() - start }));
      response.on("error", (error) => resolve({ error: error.code || error.message, ms: Date.now() - start }));
    });
    request.on("timeout", () => request.destroy(new Error("timeout")));
    request.on("error", (error) => resolve({ error: error.code || error.message, ms: Date.now() - start }));
  });
}

async function main() {
  const toxiproxy = new Toxiproxy(api);
  const seen = {};
  await toxiproxy.reset();
  const populated = await toxiproxy.populate([{ name: "populated", listen: "127.0.0.1:0", upstream }]);
  seen.populated = await get(populated.populated.listen);
  let web = await toxiproxy.createProxy({ name: "web", listen: "127.0.0.1:0", upstream });
  seen.plain = await get(web.listen);

  const slow = await web.addToxic({ name: "slow", type: "latency", stream: "downstream", toxicity: 1,
                                    attributes: { latency: 600, jitter: 0 } });
  seen.latency_toxic = slow.toJson();
  seen.latency = await get(web.listen);
  await slow.remove();
  seen.after_latency = await get(web.listen);

  const cut = await web.addToxic({ name: "cut", type: "timeout", attributes: { timeout: 300 } });
  seen.timeout_toxic = cut.toJson();
  seen.timeout = await get(web.listen);
  await cut.remove();
  seen.after_timeout = await get(web.listen);

  web = await web.update({ enabled: false, listen: web.listen, upstream, name: "web" });
  seen.disabled_enabled = web.enabled;
  seen.disabled = await get(web.listen);
  web = await web.update({ enabled: true, listen: web.listen, upstream, name: "web" });
  seen.enabled = await get(web.listen);

  await web.addToxic({ type: "latency", attributes: { latency: 600 } });
  await web.update({ enabled: false, listen: web.listen, upstream, name: "web" });
  await toxiproxy.reset();
  const after = await toxiproxy.get("web");
  const all = await toxiproxy.getAll();
  seen.reset_enabled = after.enabled;
  seen.reset_toxics = (await (await fetch(`${api}/proxies/web/toxics`)).json()).length;
  seen.proxies = Object.keys(all).sort();
  seen.after_reset = await get(after.listen);
  seen.version = await toxiproxy.getVersion();
  for (const proxy of Object.values(all)) {
    await proxy.remove();
  }
  console.log(JSON.stringify(seen));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
