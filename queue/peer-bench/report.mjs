// The table of a run of run.sh, from its raw results (one JSON line per measurement):
//   node report.mjs RESULTS.jsonl [FOOTNOTE]
import { readFileSync } from "node:fs";

const [file, footnote] = process.argv.slice(2);
const lines = readFileSync(file, "utf8").split("\n").filter((l) => l.trim() !== "");
const runs = lines.map((l) => JSON.parse(l));

/** Every round's measurement of `key`, in round order. */
const series = (key) => runs.filter((r) => r.key === key).sort((a, b) => a.round - b.round);

function median(values) {
  const v = [...values].sort((a, b) => a - b);
  if (v.length === 0) return NaN;
  const mid = Math.floor(v.length / 2);
  return v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

const fmtRate = (x) => (Number.isFinite(x) ? Math.round(x).toLocaleString("en-US") : "—");
const fmtMs = (x) => (Number.isFinite(x) ? x.toFixed(1) : "—");
const fmtRatio = (x) => (Number.isFinite(x) ? `${x.toFixed(2)}×` : "—");
const fmtBytes = (x) => (Number.isFinite(x) ? Math.round(x).toLocaleString("en-US") : "—");
const fmtCommits = (x) => (Number.isFinite(x) ? (x >= 10 ? x.toFixed(0) : x >= 0.1 ? x.toFixed(2) : x.toFixed(4)) : "—");

// A row: persevere's series against graphile-worker's, on one metric.
const rows = [];
// Sets: a series shows in more than one row.
const flags = new Set();
const problems = new Set();

function stat(key, metric, lowerIsBetter) {
  const s = series(key);
  const values = s.map((r) => r.result[metric]);
  const med = median(values);
  const best = lowerIsBetter ? Math.min(...values) : Math.max(...values);
  const worst = lowerIsBetter ? Math.max(...values) : Math.min(...values);
  for (const r of s) {
    const v = r.result[metric];
    const off = lowerIsBetter ? v > 2 * med : v < med / 2;
    const load = r.load == null ? "" : ` (load average ${r.load})`;
    if (off) flags.add(`${key} ${metric}, round ${r.round}: ${v.toFixed(1)} against a median of ${med.toFixed(1)}${load}`);
    if (r.result.errors) problems.add(`${key}, round ${r.round}: ${r.result.errors} attempt(s) refused (lease lost or conflict)`);
  }
  const perTask = (field) => median(s.filter((r) => r[field] !== undefined).map((r) => r[field] / r.result.tasks));
  return { med, best, worst, n: values.length, wal: perTask("wal_bytes"), commits: perTask("commits") };
}

function row(label, persevereKey, graphileKey, metric = "tasks_per_s") {
  const lower = metric !== "tasks_per_s";
  const p = stat(persevereKey, metric, lower);
  const g = stat(graphileKey, metric, lower);
  const fmt = lower ? fmtMs : fmtRate;
  const both = (a, b, f) => (Number.isFinite(a) || Number.isFinite(b) ? `${f(a)} / ${f(b)}` : "—");
  rows.push([
    label,
    `${fmt(p.med)} (${fmt(p.best)})`,
    `${fmt(g.med)} (${fmt(g.best)})`,
    fmtRatio(p.med / g.med),
    both(p.wal, g.wal, fmtBytes),
    both(p.commits, g.commits, fmtCommits),
  ]);
}

const tasks = runs.find((r) => r.result.mode === "execute")?.result.tasks ?? 20000;
const n = tasks.toLocaleString("en-US");
row(`enqueue ${n} one by one, tasks/s`, "persevere-pg enqueue-single", "graphile-default enqueue-single");
row(`… on SQLite`, "persevere-sqlite enqueue-single", "graphile-default enqueue-single");
row(`enqueue ${n} in one batch (\`enqueue_batch\` / \`addJobs\`), tasks/s`, "persevere-pg enqueue-batch", "graphile-default enqueue-batch");
row(`… on SQLite`, "persevere-sqlite enqueue-batch", "graphile-default enqueue-batch");
for (const c of [1, 4, 16]) {
  row(`execute ${n}, concurrency ${c}, tasks/s: both with their defaults`, `persevere-pg execute c${c}`, `graphile-default execute c${c}`);
  row(`… both batched (a buffer of 500, finished rows deleted)`, `persevere-pg-buffered execute c${c}`, `graphile-batched execute c${c}`);
  row(`… persevere on SQLite, both batched`, `persevere-sqlite execute c${c}`, `graphile-batched execute c${c}`);
}
row("pick-up latency p50, ms (lower is better)", "persevere-pg latency", "graphile-default latency", "p50_ms");
row("pick-up latency p99, ms (lower is better)", "persevere-pg latency", "graphile-default latency", "p99_ms");
row("… p50 on SQLite", "persevere-sqlite latency", "graphile-default latency", "p50_ms");
row("… p99 on SQLite", "persevere-sqlite latency", "graphile-default latency", "p99_ms");

const header = [
  "",
  "persevere: median (best)",
  "graphile-worker: median (best)",
  "persevere / graphile",
  "WAL bytes per task: persevere / graphile",
  "commits per task: persevere / graphile",
];
const out = [];
out.push(`| ${header.join(" | ")} |`);
out.push(`|${header.map((_, i) => (i === 0 ? "---" : "---:")).join("|")}|`);
for (const r of rows) out.push(`| ${r.join(" | ")} |`);
out.push("");
out.push(
  "Throughput rows: a ratio above 1 is persevere faster. Latency rows: a ratio below 1 is persevere faster " +
    "(from the call to add/enqueue to the handler's start, an idle worker, concurrency 1). " +
    "Execute rows: defaults are graphile-worker's and persevere's `Runner` as built with only `concurrency(n)` " +
    "(a buffer of n claimed jobs); batched is graphile-worker with `localQueue: { size: 500 }`, `completeJobBatchDelay: 0`, " +
    "`failJobBatchDelay: 0` and persevere's `Runner` with `buffer(500)` and `retention(Some(Duration::ZERO))`, which deletes " +
    "each finished row with its completion as graphile-worker deletes its jobs (its results are always written in batches). " +
    "persevere's handlers are async on one tokio thread (`Runner::run`), as graphile-worker's are on node's event loop. " +
    "Best is the highest throughput or the lowest latency of the rounds. WAL and commits are medians over the rounds, " +
    "read from pg_stat_wal and pg_stat_database around the measured run only (latency rows: per task added, idle polling included); " +
    "SQLite rows show graphile-worker's PostgreSQL figures.",
);
out.push("");
out.push(
  flags.size === 0
    ? "No round is below half its row's median (nor a latency above twice it)."
    : `Rounds below half their row's median (latency: above twice it): ${[...flags].join("; ")}.`,
);
if (problems.size > 0) out.push(`Refused reports: ${[...problems].join("; ")}.`);
if (footnote) {
  out.push("");
  out.push(footnote);
}
console.log(out.join("\n"));
