// node-postgres's own client/quick-disconnect-tests.js, repeated: a Client
// that calls connect() and end() at once (its Terminate goes out before the
// StartupMessage). Without a listener, an `error` event kills the process;
// here every error, unhandled rejection or missing close is counted instead.
//
//   node quick_disconnect.mjs '{"host": ..., "port": ..., "user": ..., "database": ...}' N
// prints {"runs": N, "clean": n, "failures": [...]}.
import pg from "pg";

const config = JSON.parse(process.argv[2]);
const runs = Number(process.argv[3] ?? 20);
const failures = [];
let current = -1;

process.on("uncaughtException", (e) => failures.push({ run: current, kind: "uncaught", error: String(e) }));
process.on("unhandledRejection", (e) => failures.push({ run: current, kind: "unhandled rejection", error: String(e) }));

for (let i = 0; i < runs; i++) {
  current = i;
  const client = new pg.Client(config);
  const closed = new Promise((resolve) => client.connection.once("end", () => resolve(true)));
  // The two lines of the original test.
  client.connect();
  client.end();
  const timeout = new Promise((resolve) => setTimeout(() => resolve(false), 5000));
  if (!(await Promise.race([closed, timeout]))) {
    failures.push({ run: i, kind: "timeout", error: "the connection did not close within 5 s" });
  }
  // Let an error emitted after the close surface in this run.
  await new Promise((resolve) => setTimeout(resolve, 50));
}

const failedRuns = new Set(failures.map((f) => f.run));
console.log(JSON.stringify({ runs, clean: runs - failedRuns.size, failures }));
