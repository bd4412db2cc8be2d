// LangGraph.js scenarios over @langchain/langgraph-checkpoint-postgres, as a CLI for the
// integration suite (test_js_saver.py): each command runs in its own node process and
// prints one JSON object on stdout, so racers are separate OS processes and the same
// scenario runs against PostgreSQL directly (stock) and through the proxy.
//
// Graph `prep -> gate(interrupt) -> after` over { items: string[] (concat), approved }.
// The gated node sleeps --gate-ms, then appends one JSON line to the --ledger file
// ({thread, racer, node, value, pid}): the side effect a test counts, outside the
// checkpoint tables. Graph `append` ({items, note, pending}) adds [pending] to items
// and writes note in the same task: the validity scenario.
//
//   node lg.mjs setup       --dsn D
//   node lg.mjs park        --dsn D --thread T
//   node lg.mjs resume      --dsn D --thread T [--id R] [--value JSON] [--form bare|map]
//                           [--interrupt-id I] [--checkpoint-id C] [--gate-ms MS]
//                           [--ledger FILE] [--start-at EPOCH_SECONDS]
//   node lg.mjs race-resume (resume's options) --dir DIR --id R
//       opens its pool and connects, touches DIR/ready-0-R, spins until DIR/go-0
//       exists (the barrier), resumes, writes DIR/result-0-R.json (and prints it):
//       racer.py worker's file protocol for a single job 0
//   node lg.mjs fork        --dsn D --thread T [--form bare|map] [--value JSON]
//       park at C, resume true (branch A, completes), resume at C's checkpoint_id with
//       --value (default false); in-process ledger of the gate's answers
//   node lg.mjs state       --dsn D --thread T [--checkpoint-id C]
//   node lg.mjs invalid     --dsn D --thread T [--value JSON]
//       append "a", then --value (default null), then "b"; each step's outcome
//   node lg.mjs pool-end    --dsn D [--count 50] [--mode pool|client|saver] [--thread T]
//       --count times: open, one query (saver: getTuple), end(); counts `error` events
//
// A resume result: {id, pid, thread, ok, values, interrupts, error: {code, name,
// message} | null, t_go, t_start, t_end} (epoch seconds).

import "./webcrypto.mjs";
import fs from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import pg from "pg";
import { Annotation, Command, END, START, StateGraph, interrupt } from "@langchain/langgraph";
import { PostgresSaver } from "@langchain/langgraph-checkpoint-postgres";

const OPTIONS = {
  dsn: { type: "string" },
  thread: { type: "string" },
  id: { type: "string", default: "r0" },
  value: { type: "string" },
  form: { type: "string", default: "bare" },
  "interrupt-id": { type: "string" },
  "checkpoint-id": { type: "string" },
  "gate-ms": { type: "string", default: "0" },
  ledger: { type: "string" },
  "start-at": { type: "string" },
  dir: { type: "string" },
  "barrier-timeout": { type: "string", default: "120" },
  count: { type: "string", default: "50" },
  mode: { type: "string", default: "pool" },
};

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const now = () => Date.now() / 1000;

// ----------------------------------------------------------------- graphs
const GateState = Annotation.Root({
  items: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
  approved: Annotation(),
});

const ItemsState = Annotation.Root({
  items: Annotation({ reducer: (a, b) => a.concat(b), default: () => [] }),
  note: Annotation(),
  pending: Annotation(),
});

// ctx: {thread, racer, gateMs, ledgerFile, effects}
function buildGateGraph(checkpointer, ctx) {
  return new StateGraph(GateState)
    .addNode("prep", () => ({ items: ["prep"] }))
    .addNode("gate", async () => {
      const answer = interrupt({ question: "approve?" });
      if (ctx.gateMs > 0) await sleep(ctx.gateMs);
      ctx.effects.push(answer);
      if (ctx.ledgerFile) {
        const line = { thread: ctx.thread, racer: ctx.racer, node: "gate", value: answer, pid: process.pid };
        fs.appendFileSync(ctx.ledgerFile, JSON.stringify(line) + "\n");
      }
      return { approved: answer, items: [`gate:${answer}`] };
    })
    .addNode("after", () => ({ items: ["after"] }))
    .addEdge(START, "prep")
    .addEdge("prep", "gate")
    .addEdge("gate", "after")
    .addEdge("after", END)
    .compile({ checkpointer });
}

function buildItemsGraph(checkpointer) {
  return new StateGraph(ItemsState)
    .addNode("append", (state) => ({ items: [state.pending], note: `appended ${JSON.stringify(state.pending)}` }))
    .addEdge(START, "append")
    .addEdge("append", END)
    .compile({ checkpointer });
}

// ----------------------------------------------------------------- observables
const cfgOf = (thread, checkpointId) => ({
  configurable: checkpointId ? { thread_id: thread, checkpoint_id: checkpointId } : { thread_id: thread },
});

const interruptsOf = (res) => (res?.__interrupt__ ?? []).map((i) => ({ id: i.id, value: i.value }));

function plain(res) {
  const out = { ...res };
  delete out.__interrupt__;
  return out;
}

function describeError(e) {
  return { code: e?.code ?? null, name: e?.name ?? typeof e, message: String(e?.message ?? e) };
}

function snapshot(st) {
  return {
    values: st.values,
    next: [...st.next],
    checkpoint_id: st.config?.configurable?.checkpoint_id ?? null,
    parent_checkpoint_id: st.parentConfig?.configurable?.checkpoint_id ?? null,
    interrupts: st.tasks.flatMap((t) => (t.interrupts ?? []).map((i) => ({ id: i.id, value: i.value }))),
  };
}

function resumeCommand(form, value, interruptId) {
  if (form === "map") {
    if (!interruptId) throw new Error("--form map needs --interrupt-id");
    return new Command({ resume: { [interruptId]: value } });
  }
  return new Command({ resume: value });
}

// A saver on its own pg.Pool; the pool is connected once before the caller proceeds.
async function openSaver(dsn) {
  const saver = PostgresSaver.fromConnString(dsn);
  const client = await saver.pool.connect();
  client.release();
  return saver;
}

// ----------------------------------------------------------------- commands
async function cmdSetup(a) {
  const saver = await openSaver(a.dsn);
  try {
    await saver.setup();
  } finally {
    await saver.end();
  }
  return { ok: true };
}

async function cmdPark(a) {
  const saver = await openSaver(a.dsn);
  try {
    const graph = buildGateGraph(saver, { effects: [] });
    // no getState here: through the proxy an unmarked read of the parked head claims it
    const res = await graph.invoke({ items: [], approved: null }, cfgOf(a.thread));
    return { values: plain(res), interrupts: interruptsOf(res) };
  } finally {
    await saver.end();
  }
}

async function resumeOnce(graph, a, ctx, tGo) {
  const value = a.value !== undefined ? JSON.parse(a.value) : `v-${a.id}`;
  const out = { id: a.id, pid: process.pid, thread: a.thread, t_go: tGo, t_start: now() };
  try {
    const cmd = resumeCommand(a.form, value, a["interrupt-id"]);
    const res = await graph.invoke(cmd, cfgOf(a.thread, a["checkpoint-id"]));
    Object.assign(out, { ok: true, values: plain(res), interrupts: interruptsOf(res), error: null });
  } catch (e) {
    // the racer reports, the test judges
    Object.assign(out, { ok: false, values: null, interrupts: [], error: describeError(e) });
  }
  out.effects = ctx.effects;
  out.t_end = now();
  return out;
}

function gateCtx(a) {
  return { thread: a.thread, racer: a.id, gateMs: Number(a["gate-ms"]), ledgerFile: a.ledger, effects: [] };
}

async function cmdResume(a) {
  const saver = await openSaver(a.dsn);
  try {
    const ctx = gateCtx(a);
    const graph = buildGateGraph(saver, ctx);
    if (a["start-at"]) await sleep(Math.max(0, Number(a["start-at"]) * 1000 - Date.now()));
    return await resumeOnce(graph, a, ctx, now());
  } finally {
    await saver.end();
  }
}

async function cmdRaceResume(a) {
  if (!a.dir) throw new Error("race-resume needs --dir");
  const saver = await openSaver(a.dsn);
  try {
    const ctx = gateCtx(a);
    const graph = buildGateGraph(saver, ctx);
    fs.writeFileSync(path.join(a.dir, `ready-0-${a.id}`), "");
    const go = path.join(a.dir, "go-0");
    const deadline = Date.now() + Number(a["barrier-timeout"]) * 1000;
    while (!fs.existsSync(go)) {
      if (Date.now() > deadline) throw new Error(`racer ${a.id}: no ${go} within ${a["barrier-timeout"]}s`);
      await sleep(0.5);
    }
    const out = await resumeOnce(graph, a, ctx, now());
    const file = path.join(a.dir, `result-0-${a.id}.json`);
    fs.writeFileSync(file + ".tmp", JSON.stringify(out));
    fs.renameSync(file + ".tmp", file);
    return out;
  } finally {
    await saver.end();
  }
}

async function cmdFork(a) {
  const saver = await openSaver(a.dsn);
  try {
    const ctx = { effects: [] };
    const graph = buildGateGraph(saver, ctx);
    const cfg = cfgOf(a.thread);
    const out = { thread: a.thread };
    const parked = await graph.invoke({ items: [], approved: null }, cfg);
    out.parked_interrupts = interruptsOf(parked).map((i) => i.value);
    const c = snapshot(await graph.getState(cfg));
    out.c_id = c.checkpoint_id;
    out.c_next = c.next;
    const interruptId = c.interrupts[0]?.id;
    out.a_result = plain(await graph.invoke(new Command({ resume: true }), cfg));
    out.a_effects = [...ctx.effects];
    const aFinal = snapshot(await graph.getState(cfg));
    out.a_final_id = aFinal.checkpoint_id;
    out.a_final_values = aFinal.values;
    const forkValue = a.value !== undefined ? JSON.parse(a.value) : false;
    const before = ctx.effects.length;
    const res = await graph.invoke(resumeCommand(a.form, forkValue, interruptId), cfgOf(a.thread, out.c_id));
    const head = snapshot(await graph.getState(cfg));
    out.fork = {
      result: plain(res),
      interrupts: interruptsOf(res).map((i) => i.value),
      effects: ctx.effects.slice(before),
      final_id: head.checkpoint_id,
      final_values: head.values,
      final_next: head.next,
    };
    out.a_final_by_id = (await graph.getState(cfgOf(a.thread, out.a_final_id))).values;
    out.history = [];
    for await (const h of graph.getStateHistory(cfg)) out.history.push(snapshot(h));
    out.effects = ctx.effects;
    return out;
  } finally {
    await saver.end();
  }
}

async function cmdState(a) {
  const saver = await openSaver(a.dsn);
  try {
    const graph = buildGateGraph(saver, { effects: [] });
    try {
      return { ok: true, ...snapshot(await graph.getState(cfgOf(a.thread, a["checkpoint-id"]))), error: null };
    } catch (e) {
      return { ok: false, error: describeError(e) };
    }
  } finally {
    await saver.end();
  }
}

async function cmdInvalid(a) {
  const saver = await openSaver(a.dsn);
  try {
    const graph = buildItemsGraph(saver);
    const cfg = cfgOf(a.thread);
    const step = async (pending) => {
      try {
        const res = await graph.invoke({ pending }, cfg);
        return { ok: true, values: plain(res), error: null };
      } catch (e) {
        return { ok: false, values: null, error: describeError(e) };
      }
    };
    const out = {};
    out.first = await step("a");
    out.bad = await step(a.value !== undefined ? JSON.parse(a.value) : null);
    try {
      out.state_after_bad = { ok: true, ...snapshot(await graph.getState(cfg)) };
    } catch (e) {
      out.state_after_bad = { ok: false, error: describeError(e) };
    }
    out.last = await step("b");
    return out;
  } finally {
    await saver.end();
  }
}

// `error` events of pools and clients, per source; `end()` resolves before the
// server's last bytes are read, so the count is taken after a settle time.
async function cmdPoolEnd(a) {
  const events = [];
  const onError = (source, i) => (e) => events.push({ source, i, ...describeError(e) });
  const count = Number(a.count);
  for (let i = 0; i < count; i += 1) {
    if (a.mode === "client") {
      const client = new pg.Client({ connectionString: a.dsn });
      client.on("error", onError("client", i));
      await client.connect();
      await client.query("select 1");
      await client.end();
    } else if (a.mode === "pool" || a.mode === "saver") {
      const saver = a.mode === "saver" ? PostgresSaver.fromConnString(a.dsn) : null;
      const pool = saver ? saver.pool : new pg.Pool({ connectionString: a.dsn });
      pool.on("error", onError("pool", i));
      pool.on("connect", (client) => client.on("error", onError("pool-client", i)));
      if (saver) await saver.getTuple(cfgOf(a.thread ?? "rg-js-pool-end"));
      else await pool.query("select 1");
      await (saver ? saver.end() : pool.end());
    } else {
      throw new Error(`unknown --mode ${a.mode}`);
    }
  }
  await sleep(500);
  return { mode: a.mode, count, error_events: events.length, events };
}

const COMMANDS = {
  setup: cmdSetup,
  park: cmdPark,
  resume: cmdResume,
  "race-resume": cmdRaceResume,
  fork: cmdFork,
  state: cmdState,
  invalid: cmdInvalid,
  "pool-end": cmdPoolEnd,
};

async function main() {
  const { values: a, positionals } = parseArgs({ options: OPTIONS, allowPositionals: true });
  const command = COMMANDS[positionals[0]];
  if (!command || positionals.length !== 1) {
    throw new Error(`usage: node lg.mjs ${Object.keys(COMMANDS).join("|")} --dsn DSN ... (got ${positionals})`);
  }
  if (!a.dsn) throw new Error("--dsn is required");
  if (!["setup", "pool-end"].includes(positionals[0]) && !a.thread) throw new Error("--thread is required");
  // Counted, never fatal: an `error` no listener took would otherwise kill the process
  // before it could report.
  const unhandled = [];
  process.on("uncaughtException", (e) => unhandled.push(describeError(e)));
  const out = await command(a);
  if (unhandled.length) out.unhandled = unhandled;
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`lg.mjs: ${e?.stack ?? e}\n`);
    process.exit(1);
  },
);
