// A recording HTTP proxy for trials with real clients: forwards every request to an
// upstream server unchanged and writes each POST's body and headers to a folder, so the
// requests can be replayed later against other servers (scripts/replay-messages.sh).
//
// usage: node scripts/capture-proxy.mjs UPSTREAM_PORT DIR
// Prints "capture-proxy listening on PORT" once it listens (on an ephemeral port).
// Files: DIR/NNN.json = {"method", "path", "headers", "body"} (body as parsed JSON when it
// is JSON, else text), numbered in arrival order.
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';

const [upstreamPort, dir] = process.argv.slice(2);
if (!upstreamPort || !dir) {
  console.error('usage: node scripts/capture-proxy.mjs UPSTREAM_PORT DIR');
  process.exit(2);
}
fs.mkdirSync(dir, { recursive: true });
let seq = 0;

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    if (req.method === 'POST') {
      let parsed = body.toString('utf8');
      try { parsed = JSON.parse(parsed); } catch { /* kept as text */ }
      const name = String(seq++).padStart(3, '0') + '.json';
      fs.writeFileSync(path.join(dir, name),
        JSON.stringify({ method: req.method, path: req.url, headers: req.headers, body: parsed }));
    }
    const up = http.request({ host: '127.0.0.1', port: Number(upstreamPort), method: req.method,
                              path: req.url, headers: req.headers }, (ur) => {
      res.writeHead(ur.statusCode, ur.headers);
      ur.pipe(res);
    });
    up.on('error', (e) => { res.writeHead(502); res.end(String(e)); });
    up.end(body);
  });
});
server.listen(0, '127.0.0.1', () => {
  console.log(`capture-proxy listening on ${server.address().port}`);
});
