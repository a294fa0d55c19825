// graphile-worker's side of the peer benchmark (see README.md): the same modes and output as
// `queue/examples/peer_bench.rs`, through graphile-worker's library API.
//
//   node graphile.mjs MODE --db CONNECTION_STRING [options]
//
// Modes (each prints one line of JSON on stdout):
//   migrate         install or update graphile-worker's schema (its own migrations)
//   enqueue-single  migrate, then add --tasks no-op jobs one `addJob` call at a time
//   enqueue-batch   migrate, then add --tasks no-op jobs in one `addJobs` call
//   execute         run the --tasks jobs already in the database (enqueue-batch first) with
//                   --concurrency N and --preset default|batched; tasks/s from the first
//                   handler start until the jobs table is empty
//   latency         an idle worker (concurrency 1, defaults); --samples jobs added
//                   --interval-ms apart; pick-up latency from the call to `addJob` to the start
//                   of the handler, both read on this process's clock
//
// graphile-worker is loaded from the npm project in $PEER_BENCH_NODE_DIR (run.sh installs it into
// a temporary directory), or else from a node_modules beside or above this file.

import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const from = process.env.PEER_BENCH_NODE_DIR ? `${process.env.PEER_BENCH_NODE_DIR}/package.json` : import.meta.url;
const { Logger, makeWorkerUtils, run, runMigrations } = await import(
  pathToFileURL(createRequire(from).resolve("graphile-worker")).href
);

const args = process.argv.slice(2);
const mode = args.shift();
const opts = { tasks: 20000, concurrency: 1, preset: "default", samples: 200, "interval-ms": 20, warmup: 5 };
while (args.length > 0) {
  const key = args.shift();
  if (!key.startsWith("--") || args.length === 0) usage(`bad argument ${key}`);
  const value = args.shift();
  const name = key.slice(2);
  opts[name] = ["db", "preset"].includes(name) ? value : Number(value);
}
if (!opts.db) usage("--db is required");
if (!["default", "batched"].includes(opts.preset)) usage(`unknown preset ${opts.preset}`);

function usage(message) {
  console.error(`${message}\nusage: graphile.mjs migrate|enqueue-single|enqueue-batch|execute|latency --db CONN [--tasks N] [--concurrency N] [--preset default|batched] [--samples N] [--interval-ms MS]`);
  process.exit(2);
}

// Silence the runner's own logging: stdout carries the result line only.
const logger = new Logger(() => () => {});
const nowMs = () => performance.timeOrigin + performance.now();
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));

// Options shared by every mode. The pool follows the documentation's advice ("10 or
// concurrentJobs + 2, whichever is larger"), so that concurrency 16 is not starved of
// connections; everything else is graphile-worker's default unless the preset is `batched`.
function options(concurrency) {
  const preset = { worker: {} };
  if (opts.preset === "batched") {
    preset.worker.localQueue = { size: 500 };
    preset.worker.completeJobBatchDelay = 0;
    preset.worker.failJobBatchDelay = 0;
  }
  return {
    connectionString: opts.db,
    concurrency,
    maxPoolSize: Math.max(10, concurrency + 2),
    noHandleSignals: true,
    logger,
    preset,
  };
}

function emit(result) {
  process.stdout.write(`${JSON.stringify({ system: "graphile-worker", mode, ...result })}\n`);
}

async function enqueue(batch) {
  await runMigrations(options(1));
  const utils = await makeWorkerUtils(options(1));
  try {
    const n = opts.tasks;
    let started;
    if (batch) {
      const specs = Array.from({ length: n }, () => ({ identifier: "noop", payload: {} }));
      started = nowMs();
      const jobs = await utils.addJobs(specs);
      if (jobs.length !== n) throw new Error(`addJobs returned ${jobs.length} jobs, not ${n}`);
    } else {
      started = nowMs();
      for (let i = 0; i < n; i++) await utils.addJob("noop", {});
    }
    const seconds = (nowMs() - started) / 1000;
    emit({ tasks: n, seconds, tasks_per_s: n / seconds });
  } finally {
    await utils.release();
  }
}

async function execute() {
  const n = opts.tasks;
  const utils = await makeWorkerUtils(options(1));
  let firstStart = null;
  let handled = 0;
  let allHandled;
  const handledAll = new Promise((resolve) => (allHandled = resolve));
  const runner = await run({
    ...options(opts.concurrency),
    taskList: {
      noop: async () => {
        if (firstStart === null) firstStart = nowMs();
        handled += 1;
        if (handled === n) allHandled();
      },
    },
  });
  await handledAll;
  // Every handler has returned; the last completions may still be on their way (batched):
  // the run ends when the jobs table is empty (graphile-worker deletes a completed job).
  let end;
  for (;;) {
    const { rows } = await utils.withPgClient((client) =>
      client.query("SELECT count(*)::int AS n FROM graphile_worker._private_jobs"),
    );
    end = nowMs();
    if (rows[0].n === 0) break;
    await sleep(1);
  }
  await runner.stop();
  await utils.release();
  const seconds = (end - firstStart) / 1000;
  emit({ concurrency: opts.concurrency, preset: opts.preset, tasks: n, handled, seconds, tasks_per_s: n / seconds });
}

function percentile(sorted, p) {
  // Nearest rank.
  return sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)];
}

async function latency() {
  await runMigrations(options(1));
  const utils = await makeWorkerUtils(options(1));
  const total = opts.warmup + opts.samples;
  const delays = new Array(total).fill(null);
  let handled = 0;
  let allHandled;
  const handledAll = new Promise((resolve) => (allHandled = resolve));
  const runner = await run({
    ...options(1),
    taskList: {
      noop: async (payload) => {
        delays[payload.i] = nowMs() - payload.sent;
        handled += 1;
        if (handled === total) allHandled();
      },
    },
  });
  // Let the worker connect, LISTEN and find nothing: it is idle when the first job comes.
  await sleep(500);
  const origin = nowMs();
  for (let i = 0; i < total; i++) {
    await sleep(origin + i * opts["interval-ms"] - nowMs());
    await utils.addJob("noop", { i, sent: nowMs() });
  }
  await handledAll;
  await runner.stop();
  await utils.release();
  const samples = delays.slice(opts.warmup).sort((a, b) => a - b);
  emit({
    tasks: total,
    samples: samples.length,
    interval_ms: opts["interval-ms"],
    p50_ms: percentile(samples, 50),
    p99_ms: percentile(samples, 99),
    max_ms: samples[samples.length - 1],
  });
}

switch (mode) {
  case "migrate":
    await runMigrations(options(1));
    emit({});
    break;
  case "enqueue-single":
    await enqueue(false);
    break;
  case "enqueue-batch":
    await enqueue(true);
    break;
  case "execute":
    await execute();
    break;
  case "latency":
    await latency();
    break;
  default:
    usage(`unknown mode ${mode}`);
}
