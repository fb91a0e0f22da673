// Starts `warmctx serve` on the tiny model for one test file and stops it at the end.
// The binary and the model come from the environment: WARMCTX_BIN, WARMCTX_TINY_MODEL,
// and WARMCTX_SDK_SERVE_ARGS (more serve options).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';

export async function startServer({ args = [], startTimeoutMs = 60_000 } = {}) {
  const bin = process.env.WARMCTX_BIN;
  const model = process.env.WARMCTX_TINY_MODEL;
  if (!bin || !existsSync(bin)) throw new Error(`WARMCTX_BIN is not set or missing: '${bin ?? ''}'`);
  if (!model || !existsSync(model)) throw new Error(`WARMCTX_TINY_MODEL is not set or missing: '${model ?? ''}'`);
  // One thread: the tiny model gains nothing from more, and on a busy machine llama.cpp's
  // threads waiting for each other slow every token down many times over.
  const threads = process.env.WARMCTX_SDK_THREADS ?? '1';
  // WARMCTX_SDK_SERVE_ARGS: more `serve` options for every test file, space-separated
  // (a reasoning model's runs: --reasoning-budget N).
  const extra = (process.env.WARMCTX_SDK_SERVE_ARGS ?? '').split(/\s+/).filter((a) => a.length > 0);
  const argv = ['serve', '-m', model, '--port', '0', '--no-disk', '--no-prewarm', '-c', '4096', '-t', threads, ...extra, ...args];
  const child = spawn(bin, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8');
  child.stderr.setEncoding('utf8');
  child.stdout.on('data', (d) => { stdout += d; });
  child.stderr.on('data', (d) => { stderr = (stderr + d).slice(-20_000); });
  const killOnExit = () => { if (child.exitCode === null) child.kill('SIGKILL'); };
  process.on('exit', killOnExit);

  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  let exitInfo = null;
  exited.then((e) => { exitInfo = e; });

  const deadline = Date.now() + startTimeoutMs;
  let port = null;
  while (port === null) {
    const m = stdout.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
    if (m) port = Number(m[1]);
    else if (exitInfo) throw new Error(`warmctx serve exited early (${JSON.stringify(exitInfo)}):\n${stderr}`);
    else if (Date.now() > deadline) { child.kill('SIGKILL'); throw new Error(`warmctx serve did not listen:\n${stderr}`); }
    else await sleep(50);
  }
  const url = `http://127.0.0.1:${port}`;
  for (;;) {
    try {
      const r = await fetch(`${url}/health`);
      if (r.status === 200) break;
    } catch { /* not ready yet */ }
    if (exitInfo) throw new Error(`warmctx serve exited (${JSON.stringify(exitInfo)}):\n${stderr}`);
    if (Date.now() > deadline) { child.kill('SIGKILL'); throw new Error(`/health never answered 200:\n${stderr}`); }
    await sleep(100);
  }

  return {
    url,
    baseURL: `${url}/v1`,
    logTail: (n = 30) => stderr.split('\n').slice(-n).join('\n'),
    async stop() {
      process.off('exit', killOnExit);
      if (exitInfo) return exitInfo;
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), 10_000);
      const e = await exited;
      clearTimeout(timer);
      return e;
    },
  };
}

function sleep(ms) { return new Promise((r) => setTimeout(r, ms)); }
